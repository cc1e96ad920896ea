"""``dflow schedule add|ls|pause|resume|rm`` on Redis, and the schedules under ``dflow ls``:
each shows its next fire time; bad settings are refused before anything is stored."""

from __future__ import annotations

import json

import pytest

from dflow.cli import main


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_schedule_is_added_listed_with_its_next_fire_time_paused_resumed_and_removed(
    capsys: pytest.CaptureFixture[str], redis_url: str, prefix: str
) -> None:
    store = f"{redis_url}?prefix={prefix}"
    code, out, _ = _cli(
        capsys,
        "schedule",
        "add",
        "nightly",
        "--pipeline",
        "report",
        "--cron",
        "0 3 * * *",
        "--tz",
        "Europe/Paris",
        "--param",
        '{"to": "ops"}',
        "--store",
        store,
    )
    assert code == 0 and "nightly" in out and "0 3 * * * (Europe/Paris)" in out
    code, out, _ = _cli(capsys, "schedule", "ls", "--json", "--store", store)
    (listed,) = json.loads(out)
    assert listed["name"] == "nightly" and listed["pipeline"] == "report" and not listed["paused"]
    assert listed["next_at"] is not None and listed["next_at"] % 3600 == 0, "at an hour"
    assert _cli(capsys, "schedule", "pause", "nightly", "--store", store)[0] == 0
    code, out, _ = _cli(capsys, "schedule", "ls", "--store", store)
    assert code == 0 and "paused" in out.splitlines()[1]
    assert _cli(capsys, "schedule", "resume", "nightly", "--store", store)[0] == 0
    code, out, _ = _cli(capsys, "ls", "--store", store)
    assert code == 0 and "SCHEDULE" in out and "nightly" in out and "paused" not in out, "dflow ls shows it"
    assert _cli(capsys, "schedule", "rm", "nightly", "--store", store)[0] == 0
    code, _, err = _cli(capsys, "schedule", "rm", "nightly", "--store", store)
    assert code == 1 and "no schedule 'nightly': `dflow schedule ls` lists them" in err
    assert (
        _cli(capsys, "schedule", "ls", "--store", store)[1].strip() == "no schedules are kept in this store"
    )


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--cron", "99 * * * *"), "the cron expression '99 * * * *' does not parse"),
        (("--every", "0"), "every=0.0 is not an interval over 0"),
        (
            ("--every", "soon"),
            "--every 'soon' is not an interval: give seconds or a number with s, m, h or d",
        ),
        (("--every", "5m", "--tz", "Nowhere/City"), "the time zone 'Nowhere/City' is unknown"),
        (("--every", "5m", "--param", "{oops"), "--param '{oops' is not JSON"),
    ],
)
def test_bad_settings_are_refused_with_what_to_do_and_nothing_is_kept(
    capsys: pytest.CaptureFixture[str], redis_url: str, prefix: str, args: tuple[str, ...], said: str
) -> None:
    store = f"{redis_url}?prefix={prefix}"
    code, _, err = _cli(capsys, "schedule", "add", "beat", "--pipeline", "p", *args, "--store", store)
    assert code == 2 and said in err
    assert _cli(capsys, "schedule", "ls", "--json", "--store", store)[1].strip() == "[]"

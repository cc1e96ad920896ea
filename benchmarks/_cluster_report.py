"""The report of bench_cluster.py: its results turned into the markdown page (sections 1 to 4),
and the projection of section 5 (steps/s of one shard and of 10, from the CPU time per step,
and how ``redis-cli --cluster create`` spreads the buckets over the masters)."""

from __future__ import annotations

import statistics
from typing import Any

from redis.crc import key_slot

from dflow.adapters.redis.keyspace import Keyspace

# -- projection ------------------------------------------------------------------------


def redis_cli_ranges(masters: int) -> list[tuple[int, int]]:
    """The slot ranges ``redis-cli --cluster create`` gives ``masters`` masters."""
    per = 16384 / masters
    out, first, cursor = [], 0, 0.0
    for i in range(masters):
        last = 16383 if i == masters - 1 else max(first, int(cursor + per - 1 + 0.5))
        out.append((first, last))
        first, cursor = last + 1, cursor + per
    return out


def buckets_per_master(masters: int, streams: int) -> list[int]:
    ranges = redis_cli_ranges(masters)
    count = [0] * masters
    for tag in Keyspace(streams, cluster=True).tags:
        slot = key_slot(f"{{{tag}}}".encode())
        count[next(i for i, (a, b) in enumerate(ranges) if a <= slot <= b)] += 1
    return count


def shard_cpu(r: dict[str, Any]) -> dict[str, float]:
    """Each master's CPU seconds per step of the runs it holds."""
    return {
        p: s["cpu_s"] / s["steps"] for p, s in r["shards"].items() if s["role"] == "master" and s["steps"]
    }


def projection(rows: list[dict[str, Any]], shards: int = 10) -> dict[str, Any]:
    """Steps/s of one shard and of ``shards`` from the 3-master cluster's CPU per step (row 3)."""
    per = rows[3]["shard_cpu_per_step_s"]
    mean, worst = statistics.fmean(per.values()), max(per.values())
    spread = {n: buckets_per_master(shards, n) for n in (16, 20, 32, 40)}
    others = {
        label(r): statistics.fmean(r["shard_cpu_per_step_s"].values()) for i, r in enumerate(rows) if i != 3
    }
    return {
        "from": label(rows[3]),
        "cpu_per_step_by_shard_s": per,
        "cpu_per_step_mean_s": mean,
        "cpu_per_step_worst_s": worst,
        "per_shard_steps_per_s": 1 / mean,
        "per_shard_steps_per_s_worst": 1 / worst,
        "shards": shards,
        "even_steps_per_s": shards / mean,
        "buckets_per_master": {str(n): c for n, c in spread.items()},
        "uneven_steps_per_s": {str(n): (1 / mean) * n / max(c) for n, c in spread.items()},
        "others_cpu_per_step_s": others,
        "by_masters_cpu_per_step_s": [
            statistics.fmean(r["shard_cpu_per_step_s"].values()) for r in rows[1:4]
        ],
    }


# -- tables ----------------------------------------------------------------------------


def us(x: float) -> str:
    return f"{x * 1e6:,.0f} µs"


def label(r: dict[str, Any]) -> str:
    return str(r["name"]) + (f", wait={r['wait']}" if r["replicas"] else "")


def ratio(a: dict[str, Any], b: dict[str, Any]) -> float:
    """The median over the rounds of a's steps/s over b's in the same round."""
    return float(statistics.median(x / y for x, y in zip(a["steps_per_s_reps"], b["steps_per_s_reps"])))


def section_throughput(rows: list[dict[str, Any]], params: dict[str, Any]) -> list[str]:
    out = [
        f"### 1. Throughput: {params['workers']} worker processes (concurrency {params['concurrency']}), 5-step "
        f"chains of trivial steps, {rows[0]['runs']} runs started at once",
        "",
        "| store + transport | masters | streams | steps/s (median) | each round | vs one server | Redis CPU / step "
        "(masters) | workers CPU / step | client CPU / step | commands / step | bytes in / step | bytes out / step |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        out.append(
            f"| {label(r)} | {r['masters']} | {r['streams']} | **{r['steps_per_s_median']:,.0f}** "
            f"| {' / '.join(f'{x:,.0f}' for x in r['steps_per_s_reps'])} | {ratio(r, rows[0]):.2f}x "
            f"| {us(r['redis_cpu_per_step_s'])} | {us(r['worker_cpu_per_step_s'])} | {us(r['client_cpu_per_step_s'])} "
            f"| {r['commands_per_step']:.1f} | {r['net_in_per_step']:,.0f} B | {r['net_out_per_step']:,.0f} B |"
        )
    out += [
        "",
        "Rounds: every target in turn, then again, each time its runs started at once by this client "
        "(32 in flight); steps/s = steps / (first start to every stream seen empty); vs one server = the median "
        "of each round's ratio to the one server's steps/s in that round. The other columns: medians over the "
        "rounds. Commands: INFO commandstats of every master, those run inside scripts "
        "included, this script's INFO and XLEN left out; bytes: total_net_input_bytes / total_net_output_bytes of "
        "every master less this script's and less replication; a run's creation is in its steps' share. CPU: "
        "used_cpu_user + used_cpu_sys of every master; of the worker processes; of this client (its polls "
        "included). New connections and error replies (INFO stats) are the masters' over the window: redis-py 8 "
        "sets up each new connection with CLIENT SETINFO (twice) and CLIENT MAINT_NOTIFICATIONS, which Redis 7.0 "
        "refuses (3 error replies a connection).",
        "",
    ]
    one, c1 = rows[0], rows[1]
    out.append(
        f"- The cluster path on 1 master against one server: steps/s {ratio(c1, one):.2f}x; Redis CPU "
        f"per step {c1['redis_cpu_per_step_s'] / one['redis_cpu_per_step_s']:.2f}x, the workers' "
        f"{c1['worker_cpu_per_step_s'] / one['worker_cpu_per_step_s']:.2f}x, this client's "
        f"{c1['client_cpu_per_step_s'] / one['client_cpu_per_step_s']:.2f}x; bytes sent to Redis per step "
        f"{c1['net_in_per_step'] / one['net_in_per_step']:.2f}x (on a cluster each script call names its keys: the "
        "run's, its bucket's indexes and stream). Here the workers and Redis share 2 cores, so the workers' CPU "
        "sets the pace more than Redis'."
    )
    for r in rows:
        top = ", ".join(f"{k} {v:.2f}" for k, v in list(r["by_name_per_step"].items())[:12])
        notes = [f"{r['new_connections']} new connections, {r['error_replies']} error replies"]
        late = [x for x in r["all_stragglers"] if x["stragglers"]]
        if late:
            notes.append(
                f"**runs left without a message** in {len(late)} round(s): "
                + ", ".join(
                    f"{x['stragglers']} ({x['statuses']}, finished "
                    + (
                        "not within 120 s"
                        if x["finished_after_s"] is None
                        else f"{x['finished_after_s']:.0f} s"
                    )
                    + " later)"
                    for x in late
                )
            )
        if r["worker_log_problems"]:
            notes.append(
                f"the workers logged {r['worker_log_problems']} errors/warnings over all rounds, e.g. "
                f"`{r['worker_log_problems_first'][0].split(' ', 2)[-1][:160]}`"
            )
        out.append(f"- {label(r)}: per step {top}" + ("; " + "; ".join(notes) if notes else ""))
    return out + [""]


def section_shards(rows: list[dict[str, Any]]) -> list[str]:
    out = [
        "### 2. Each master, per step of the runs it holds",
        "",
        "| store + transport | master | buckets | steps on it | CPU / step | EVALSHA / step | EVALSHA µs / call "
        "| EVALSHA µs / step | commands / step | bytes in / out per step |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        masters = [(p, s) for p, s in r["shards"].items() if s["role"] == "master" and s["steps"]]
        for i, (port, s) in enumerate(masters):
            n, ev, usec = s["steps"], s["calls"].get("evalsha", 0), s["usec"].get("evalsha", 0)
            cpu = r["shard_cpu_per_step_s"][port]
            out.append(
                f"| {label(r)} | {i + 1} | {s['buckets']} | {n:,} | {us(cpu)} | {ev / n:.2f} "
                f"| {usec / max(1, ev):.1f} | {usec / n:.1f} | {sum(s['calls'].values()) / n:.1f} "
                f"| {s['net_in'] / n:,.0f} / {s['net_out'] / n:,.0f} B |"
            )
    return out + [
        "",
        "Steps on a master: 5 per run in its buckets (a run's bucket from its trace id, the bucket's "
        "master from CLUSTER SLOTS); CPU / step = its CPU time over the window / those steps, the median "
        "over the rounds; the other columns come from the round of median steps/s. EVALSHA µs: INFO "
        "commandstats usec, the time the scripts ran.",
        "",
    ]


def section_wait(rows: list[dict[str, Any]]) -> list[str]:
    w0 = next((r for r in rows if r["replicas"] and not r["wait"]), None)
    w1 = next((r for r in rows if r["wait"]), None)
    if not (w0 and w1):
        return []
    out = [
        "### 3. `wait=1`: 3 masters with a replica each, against wait=0 on the same cluster",
        "",
        "| wait | steps/s (median) | vs wait=0 | masters CPU / step | replicas CPU / step | WAIT / step "
        "| replication bytes / step |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in (w0, w1):
        out.append(
            f"| {r['wait']} | {r['steps_per_s_median']:,.0f} | "
            f"{ratio(r, w0):.2f}x | {us(r['redis_cpu_per_step_s'])} "
            f"| {us(r['replica_cpu_per_step_s'])} | {r['by_name_per_step'].get('wait', 0):.2f} "
            f"| {r['repl_out_per_step']:,.0f} B |"
        )
    return out + [
        "",
        "The replicas run on the same machine (loopback, the same 2 cores): a WAIT waits for a "
        "replica's acknowledgement, which here costs CPU and a local round trip, not a network.",
        "",
    ]


def section_idle(rows: list[dict[str, Any]]) -> list[str]:
    out = [
        f"### 4. Idle workers on {rows[0]['masters']} masters, streams=16",
        "",
        "| idle workers | window | commands/s, all masters (INFO) | per worker | sent per worker (MONITOR) "
        "| + inside scripts | Redis CPU, all masters | worker CPU, each | per worker and second: sent, by command |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        top = ", ".join(f"{k} {v / r['workers']:.2f}" for k, v in r["sent_by_name_per_s"].items())
        out.append(
            f"| {r['workers']} | {r['window_s']:.1f} s | {r['commands_per_s']:.1f} "
            f"| {r['commands_per_worker_s']:.2f} | {r['sent_per_worker_s']:.2f} | {r['inner_per_worker_s']:.2f} "
            f"| {r['redis_cpu_per_s'] * 100:.2f}% | {r['worker_cpu_per_s'] * 100:.2f}% | {top} |"
        )
    return out + [
        "",
        "Workers started, 3 s left for start-up, then the window. INFO counts every command a master "
        "ran, those inside scripts included; MONITOR (on every master, same window) tells them apart. On "
        "one server (benchmarks/results/idle.md, streams=1) an idle worker sends about 1.6 commands/s "
        "(+3.0 inside scripts).",
        "",
    ]


def tables(res: dict[str, Any], quick: bool) -> str:
    rows = res["throughput"]
    out = (
        section_throughput(rows, res["params"])
        + section_shards(rows)
        + section_wait(rows)
        + section_idle(res["idle"])
    )
    out += projection_text(res["projection"])
    if quick:
        out += ["", "(--quick: fewer runs, one round, shorter idle windows)"]
    return "\n".join(out)


def load_note(cpu: list[float]) -> list[str]:
    """What the masters' CPU per step did as 1, 2 and 3 of them shared the same load."""
    text = (
        "A master's CPU per step with 1, 2 and 3 masters sharing the same steps: "
        + " / ".join(us(c) for c in cpu)
        + "."
    )
    if cpu[0] < cpu[2]:
        text += (
            " It rose as each master's share of the load fell: measured here, not explained, but in line with "
            "a busier Redis doing more per wake-up. A saturated shard then likely needs no more than the "
            "1-master figure per step, and the projection from 3 masters errs low."
        )
    return [text, ""]


def projection_text(p: dict[str, Any]) -> list[str]:
    by_shard = ", ".join(us(c) for c in p["cpu_per_step_by_shard_s"].values())
    cap, n = p["per_shard_steps_per_s"], p["shards"]
    return [
        "### 5. Projection",
        "",
        f"From the {p['from']}: the CPU time (user + system) each master spent per step of the runs it holds "
        f"(as in section 2, median over the rounds): {by_shard}; mean **{us(p['cpu_per_step_mean_s'])}** "
        f"= {p['cpu_per_step_mean_s']:.6f} s.",
        "",
        f"- one shard: 1 / {p['cpu_per_step_mean_s']:.6f} s per step = **{cap:,.0f} steps/s** (the busiest master's "
        f"{us(p['cpu_per_step_worst_s'])}: 1 / {p['cpu_per_step_worst_s']:.6f} = "
        f"{p['per_shard_steps_per_s_worst']:,.0f} steps/s)",
        f"- {n} shards: {n} x {cap:,.0f} = **{p['even_steps_per_s']:,.0f} steps/s**",
        "- the same arithmetic on the other rows' masters (mean CPU per step → one shard): "
        + "; ".join(f"{k}: {us(v)} → {1 / v:,.0f} steps/s" for k, v in p["others_cpu_per_step_s"].items()),
        "",
        *load_note(p["by_masters_cpu_per_step_s"]),
        "Assumptions: a shard's Redis is bound by its CPU, one core (it runs commands on one thread), which it has "
        "to itself; the steps are spread evenly over the buckets (trace ids are random) and the buckets evenly over "
        "the shards (below: not so with streams=16 on 10 masters); the workers are not the bottleneck (here they, "
        "every Redis and this client share 2 cores, so the steps/s of section 1 are this machine's limit, not a "
        "shard's); the network is not the bottleneck (here loopback); steps like these (trivial 5-step chains, "
        "small values). The CPU per step was measured on masters far from busy and includes their background "
        "work (cron, cluster bus) over the window; a saturated Redis reads more commands per system call, so a "
        "step may cost it less. A replica per master, and `wait=1`, cost the masters more (the rows above).",
        "",
        f"Buckets per master with {n} masters (`redis-cli --cluster create` gives them equal slot ranges; bucket i's "
        "tag hashes into the i-th of `streams` equal ranges): "
        + "; ".join(f"streams={k}: {sorted(c, reverse=True)}" for k, c in p["buckets_per_master"].items())
        + ". The busiest master takes max/streams of the steps, so the cluster saturates at one shard x streams / "
        "max: "
        + ", ".join(
            f"streams={k}: {cap:,.0f} x {k} / {max(p['buckets_per_master'][k])} = {v:,.0f} steps/s"
            for k, v in p["uneven_steps_per_s"].items()
        )
        + f". With the default streams=16, {n} shards carry {p['uneven_steps_per_s']['16'] / cap:.0f}x one shard, "
        f"not {n}x; a `streams` that is a multiple of the number of masters spreads evenly.",
    ]


def page(res: dict[str, Any]) -> str:
    """The results file: what ran where, then the tables."""
    run = res["run"]
    return (
        f"# Redis Cluster benchmark\n\n{run['date']}, Python {run['python']}, {run['cpus']} CPUs, Redis "
        f"{run['redis_server']}, redis-py {run['redis_py']}; `{run['command']}` ({run['runtime_s']:.0f} s, load "
        f"average {run['loadavg_before'][0]:.2f} before, {run['loadavg_after'][0]:.2f} after). Every Redis node, "
        "the workers and this client share this machine; the Redis servers are this script's own (no saving, "
        "no AOF). Other work on the machine moves steps/s and CPU per step by tens of percent from one run to "
        "the next: compare the rows of one run, not runs.\n\n" + tables(res, run["quick"])
    )

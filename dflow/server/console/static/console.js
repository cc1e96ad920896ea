// The dflow console's script: the runs list's refresh, a run page's live updates (server-sent
// events), the step panel, and the actions (cancel, answer a from_call, re-run from a step),
// each confirmed.
// Everything the server stores is put in the page as text (textContent), or as HTML the
// server wrote with every stored text escaped.
(function () {
  "use strict";

  var meta = document.querySelector('meta[name="dflow-csrf"]');
  var csrf = meta ? meta.getAttribute("content") : "";
  // The runs list's first page (and the workers page) refreshes its counts and rows every few
  // seconds while shown (the filters, which one may be typing in, stay as they are).
  var list = document.querySelector(".runs-list[data-refresh], .workers-list[data-refresh]");
  if (list) {
    var every = Number(list.getAttribute("data-refresh")) * 1000;
    var refreshing = false;
    window.setInterval(async function () {
      if (document.hidden || refreshing) {
        return;
      }
      refreshing = true;
      try {
        var response = await fetch(window.location.href, { credentials: "same-origin" });
        if (response.ok) {
          var fresh = new DOMParser().parseFromString(await response.text(), "text/html");
          ["table.runs", "table.workers", ".chips"].forEach(function (sel) {
            var now = list.querySelector(sel);
            var next = fresh.querySelector("[data-refresh] " + sel);
            if (now && next && now.innerHTML !== next.innerHTML) {
              now.innerHTML = next.innerHTML; // written by the server, every stored text escaped
            }
          });
          var badge = document.getElementById("live");
          if (badge) {
            badge.textContent = "refreshed " + new Date().toISOString().slice(11, 19) + " UTC";
            badge.className = "live on";
          }
        }
      } catch (err) {
        // (the server is away for now: the next round tries again)
      } finally {
        refreshing = false;
      }
    }, every);
  }
  var page = document.querySelector(".run");
  if (!page) {
    return;
  }
  var run = page.getAttribute("data-run");
  var api = "/console/api/runs/";
  var selected = null; // [run, seq] of the step shown in the panel
  var shown = {}; // the HTML last put in each part

  function path(id) {
    return id.split("/").map(encodeURIComponent).join("/");
  }

  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) {
      node.className = cls;
    }
    if (text !== undefined && text !== null) {
      node.textContent = String(text);
    }
    return node;
  }

  function flash(text, bad) {
    var box = document.getElementById("flash");
    if (box) {
      box.textContent = text;
      box.className = "flash" + (bad ? " bad" : " ok");
    }
  }

  async function post(url, body) {
    var response = await fetch(url, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-DFlow-CSRF": csrf },
      body: JSON.stringify(body),
    });
    var data = null;
    try {
      data = await response.json();
    } catch (e) {
      data = null;
    }
    if (!response.ok) {
      var detail = data && data.detail !== undefined ? data.detail : "HTTP " + response.status;
      var failed = new Error(typeof detail === "string" ? detail : JSON.stringify(detail));
      failed.data = data;
      throw failed;
    }
    return data;
  }

  // -- live updates ---------------------------------------------------------------------------

  function put(id, html) {
    var box = document.getElementById(id);
    if (box && shown[id] !== html) {
      box.innerHTML = html; // written by the server, every stored text escaped
      shown[id] = html;
    }
  }

  function mark() {
    if (!selected) {
      return;
    }
    document.querySelectorAll("#tree .node.selected").forEach(function (n) {
      n.classList.remove("selected");
    });
    document.querySelectorAll("#tree .node[data-seq]").forEach(function (n) {
      if (n.getAttribute("data-run") === selected[0] && n.getAttribute("data-seq") === selected[1]) {
        n.classList.add("selected");
      }
    });
  }

  var pendingWaits = null;

  function typing() {
    var active = document.activeElement;
    var waits = document.getElementById("waits");
    return !!(waits && active && active.tagName === "TEXTAREA" && waits.contains(active));
  }

  // -- a model's reply as it streams (event: live), until the step commits it ---------------------

  var streaming = null; // {call, seq, box, text, calls, ended} of the reply streaming now

  function streamingBox() {
    var box = el("div", "msg assistant streaming");
    box.setAttribute("aria-live", "polite");
    var who = el("div", "who", "Thought · streaming…");
    box.appendChild(who);
    box.appendChild(el("div", "text"));
    box.appendChild(el("div", "calls"));
    return box;
  }

  function attachStreaming() {
    if (!streaming || streaming.ended) {
      return;
    }
    var holder = document.getElementById("conversation");
    var msgs = holder ? holder.querySelector(".msgs") : null;
    if (holder && !msgs) {
      var card = el("section", "card conversation");
      card.appendChild(el("h2", null, "Conversation"));
      msgs = el("div", "msgs");
      card.appendChild(msgs);
      holder.appendChild(card);
    }
    if (msgs && streaming.box.parentNode !== msgs) {
      msgs.appendChild(streaming.box);
    }
  }

  function onLive(event) {
    var data = event.data || {};
    if (!data.call || !data.kind || data.kind.indexOf("model.") !== 0) {
      return;
    }
    if (!streaming || streaming.call !== data.call) {
      if (streaming && streaming.box.parentNode) {
        streaming.box.parentNode.removeChild(streaming.box); // a call made again starts over
      }
      streaming = {
        call: data.call,
        seq: event.seq,
        box: streamingBox(),
        text: "",
        calls: {},
        complete: false,
        ended: false,
      };
    }
    var who = streaming.box.querySelector(".who");
    if (data.kind === "model.delta") {
      streaming.text += data.text || "";
      streaming.box.querySelector(".text").textContent = streaming.text;
    } else if (data.kind === "model.tool") {
      var call = streaming.calls[data.index];
      if (!call) {
        call = streaming.calls[data.index] = { name: "", args: "", node: el("div", "call") };
        streaming.box.querySelector(".calls").appendChild(call.node);
      }
      call.name = data.name && data.name !== call.name ? call.name + data.name : call.name;
      call.args += data.arguments || "";
      call.node.textContent = call.name + " " + call.args;
    } else if (data.kind === "model.dropped") {
      who.textContent = "Thought · the stream dropped: asked again";
    } else if (data.kind === "model.end") {
      who.textContent = "Thought · complete";
      streaming.complete = true;
    }
    attachStreaming();
  }

  function apply(state) {
    put("head", state.head);
    put("tree", state.tree);
    put("timeline", state.timeline);
    put("conversation", state.conversation);
    if (streaming && streaming.complete) {
      streaming.ended = true; // the step committed the reply: the conversation shows it now
    }
    attachStreaming();
    if (typing()) {
      pendingWaits = state.waits; // put in once the answer being written loses focus
    } else {
      pendingWaits = null;
      put("waits", state.waits);
    }
    var cancel = document.getElementById("cancel");
    if (cancel && state.status && ["done", "failed", "cancelled", "compensated", "timed_out"].indexOf(state.status) >= 0) {
      cancel.hidden = true;
    }
    page.setAttribute("data-status", state.status || "");
    mark();
  }

  function live(text, on) {
    var badge = document.getElementById("live");
    if (badge) {
      badge.textContent = text;
      badge.className = "live" + (on ? " on" : "");
    }
  }

  // A page holds its stream only while its run may change by itself and the page is seen: a
  // browser allows six connections to a host, so pages of runs that wait or sleep (and hidden
  // tabs) let theirs go, and look at the run every POLL_MS instead.
  var POLL_MS = 3000;
  var source = null;
  var polling = null;

  function stopFollowing() {
    if (source) {
      source.close();
      source = null;
    }
    if (polling) {
      window.clearTimeout(polling);
      polling = null;
    }
  }

  function ended() {
    stopFollowing();
    live("ended", false);
    page.setAttribute("data-live", "0");
  }

  function follow() {
    if (page.getAttribute("data-live") !== "1" || !window.EventSource) {
      return;
    }
    stopFollowing();
    if (document.hidden) {
      live("paused", false);
      return;
    }
    source = new EventSource(api + path(run) + "/stream");
    source.addEventListener("open", function () {
      live("live", true);
    });
    source.addEventListener("state", function (e) {
      apply(JSON.parse(e.data));
    });
    source.addEventListener("live", function (e) {
      onLive(JSON.parse(e.data));
    });
    source.addEventListener("end", ended);
    source.addEventListener("idle", function (e) {
      var state = JSON.parse(e.data);
      stopFollowing();
      live(state.status + " · checked every " + POLL_MS / 1000 + " s", false);
      poll();
    });
    ["expired", "busy"].forEach(function (name) {
      source.addEventListener(name, function (e) {
        stopFollowing();
        live("stopped", false);
        flash(JSON.parse(e.data).error, true);
      });
    });
    source.addEventListener("error", function () {
      if (source && source.readyState === EventSource.CLOSED) {
        live("disconnected", false);
      } else {
        live("reconnecting…", false);
      }
    });
  }

  function poll() {
    polling = window.setTimeout(async function () {
      polling = null;
      var state = null;
      try {
        var response = await fetch(api + path(run) + "/tree", { credentials: "same-origin" });
        state = response.ok ? await response.json() : null;
      } catch (err) {
        state = null; // (the server is away for now: look again later)
      }
      if (state === null) {
        poll();
      } else if (state.finished) {
        apply(state);
        ended();
      } else if (state.status !== page.getAttribute("data-status") || state.tree !== shown.tree) {
        apply(state);
        follow(); // it moves: live again
      } else {
        poll();
      }
    }, POLL_MS);
  }

  document.addEventListener("visibilitychange", function () {
    if (document.hidden) {
      if (source) {
        stopFollowing();
        live("paused", false);
      }
    } else if (page.getAttribute("data-live") === "1" && !polling) {
      follow();
    }
  });

  // -- the step panel ---------------------------------------------------------------------------

  function section(panel, title, text, cls) {
    if (text === null || text === undefined || text === "") {
      return;
    }
    panel.appendChild(el("h3", null, title));
    panel.appendChild(el("pre", cls || null, text));
  }

  async function showStep(stepRun, seq) {
    selected = [stepRun, seq];
    mark();
    var panel = document.getElementById("detail");
    var response = await fetch(api + path(stepRun) + "/steps/" + encodeURIComponent(seq), {
      credentials: "same-origin",
    });
    var data = await response.json();
    panel.textContent = "";
    if (!response.ok) {
      panel.appendChild(el("p", "error", data.detail || "HTTP " + response.status));
      return;
    }
    panel.appendChild(el("h2", null, data.name));
    var facts = el("dl", "facts small");
    var rows = [
      ["Status", data.status],
      ["Step", "#" + data.seq + (data.attempt ? " · attempt " + (data.attempt + 1) : "")],
      ["Started (UTC)", data.started ? new Date(data.started * 1000).toISOString().replace("T", " ").slice(0, 23) : "–"],
      ["Duration", (data.duration * 1000).toFixed(2) + " ms"],
      ["Worker", data.worker || "–"],
      ["Key", data.key],
    ];
    if (stepRun !== run) {
      rows.push(["Branch run", stepRun]);
    }
    rows.forEach(function (row) {
      var pair = el("div");
      pair.appendChild(el("dt", null, row[0]));
      pair.appendChild(el("dd", null, row[1]));
      facts.appendChild(pair);
    });
    panel.appendChild(facts);
    var box = panel.getBoundingClientRect();
    if (box.top < 0 || box.top > window.innerHeight) {
      panel.scrollIntoView({ block: "start", behavior: "smooth" });
    }
    section(panel, "Input", data.input);
    section(panel, "Output", data.output);
    if (data.error) {
      section(panel, "Error", (data.error.type || "") + ": " + (data.error.message || ""), "bad");
      section(panel, "Traceback", data.error.traceback, "tb");
    }
    var ended = ["done", "failed", "cancelled", "compensated", "timed_out"].indexOf(page.getAttribute("data-status")) >= 0;
    if (data.status !== "entry" && stepRun === run && run.indexOf("/") < 0) {
      if (ended) {
        var again = el("button", "rerun", "Re-run from this step");
        again.type = "button";
        again.addEventListener("click", function () {
          rerun(stepRun, data.seq, data.name);
        });
        panel.appendChild(again);
      } else {
        panel.appendChild(el("p", "note", "A run can be re-run from a step once it has ended."));
      }
    }
  }

  // -- the actions -------------------------------------------------------------------------------

  async function rerun(stepRun, seq, name) {
    if (!window.confirm("Start a new run of " + stepRun + " from step #" + seq + " (" + name + ")?")) {
      return;
    }
    var url = api + path(stepRun) + "/rerun";
    try {
      var made;
      try {
        made = await post(url, { seq: seq });
      } catch (err) {
        var rerunAs = err.data && err.data.rerun;
        if (!rerunAs || !window.confirm(
          "Run " + stepRun + " was rerun already, as run " + rerunAs + ". Its steps from #" + seq +
          " would run once more. Start another rerun anyway?")) {
          throw err;
        }
        made = await post(url + "?again=true", { seq: seq });
      }
      window.location.href = made.url;
    } catch (err) {
      flash("Re-run refused: " + err.message, true);
    }
  }

  async function cancel() {
    if (!window.confirm("Cancel run " + run + "? Its waits, timers and branches end; this cannot be undone.")) {
      return;
    }
    try {
      var after = await post(api + path(run) + "/cancel", { reason: "cancelled from the console" });
      flash("Run " + after.status + ".", false);
      document.getElementById("cancel").hidden = after.finished;
      follow();
    } catch (err) {
      flash("Cancel refused: " + err.message, true);
    }
  }

  async function answer(form) {
    var problem = form.querySelector(".error");
    var text = form.querySelector("textarea").value;
    var payload;
    problem.hidden = true;
    try {
      payload = JSON.parse(text);
    } catch (err) {
      problem.textContent = "Not valid JSON, nothing was sent: " + err.message;
      problem.hidden = false;
      return;
    }
    var call = form.getAttribute("data-call");
    var target = form.getAttribute("data-run");
    if (!window.confirm("Answer call '" + call + "' of run " + target + " with this JSON?")) {
      return;
    }
    try {
      await post(api + path(run) + "/answer", { call_type: call, payload: payload, run: target });
      form.classList.add("sent");
      form.querySelector("button").disabled = true;
      flash("Answer sent to '" + call + "'.", false);
      follow(); // the run goes on: follow it live
    } catch (err) {
      problem.textContent = "Refused: " + err.message;
      problem.hidden = false;
    }
  }

  document.addEventListener("click", function (e) {
    var node = e.target.closest ? e.target.closest("#tree .node[data-seq], #timeline .bar") : null;
    if (node) {
      showStep(node.getAttribute("data-run"), node.getAttribute("data-seq"));
    }
  });
  document.addEventListener("submit", function (e) {
    var form = e.target;
    if (form.classList && form.classList.contains("answer")) {
      e.preventDefault();
      answer(form);
    }
  });
  document.addEventListener("focusout", function () {
    window.setTimeout(function () {
      if (pendingWaits !== null && !typing()) {
        put("waits", pendingWaits);
        pendingWaits = null;
      }
    }, 0);
  });
  var cancelButton = document.getElementById("cancel");
  if (cancelButton) {
    cancelButton.addEventListener("click", cancel);
  }
  follow();
})();

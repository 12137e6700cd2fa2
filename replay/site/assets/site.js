/* The audit site's two interactive pages: the steps table (steps.html) and the step view (step.html?step=N).
 * Data files call SITE.receive(name, data). Every value that comes from the run, its corpus or a certificate is
 * put into the page with textContent (never as HTML), so a document holding markup shows as text. */
"use strict";
var SITE = (function () {
  var data = {};
  var PAGE_ROWS = 100;  // the table renders one page of rows at a time: 10^5 steps are never 10^5 DOM rows

  function receive(name, value) { data[name] = value; }

  function byId(id) { return document.getElementById(id); }

  /* An element with text (textContent), a class, attributes and children. */
  function el(tag, opts, children) {
    var e = document.createElement(tag);
    opts = opts || {};
    if (opts.text !== undefined && opts.text !== null) e.textContent = String(opts.text);
    if (opts.cls) e.className = opts.cls;
    if (opts.href) e.setAttribute("href", opts.href);
    (children || []).forEach(function (c) { if (c) e.appendChild(c); });
    return e;
  }

  function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }

  function stepLink(step) { return el("a", {href: "step.html?step=" + Number(step), text: String(step)}); }

  /* Load a data file (a script calling SITE.receive): works from file:// and over HTTP alike. */
  function loadScript(src) {
    return new Promise(function (resolve, reject) {
      var s = document.createElement("script");
      s.src = src;
      s.onload = resolve;
      s.onerror = function () { reject(new Error("could not load " + src)); };
      document.head.appendChild(s);
    });
  }

  // -- the steps table ------------------------------------------------------------------------------------------
  function stepsPage() {
    var s = data.steps, run = data.run, q = new URLSearchParams(location.search);
    var fStatus = byId("f-status"), fTopo = byId("f-topology"), fFrom = byId("f-from"), fTo = byId("f-to");
    run.statuses.forEach(function (name) { fStatus.appendChild(el("option", {text: name})); });
    s.topologies.forEach(function (t) { fTopo.appendChild(el("option", {text: t})); });
    fStatus.value = q.get("status") || "";
    fTopo.value = q.get("topology") || "";
    fFrom.value = q.get("from") || "";
    fTo.value = q.get("to") || "";
    var matches = [], page = 0;

    function bound(input, fallback) {
      var v = parseInt(input.value, 10);
      return isNaN(v) ? fallback : v;
    }

    function filter() {
      var st = fStatus.value === "" ? -1 : run.statuses.indexOf(fStatus.value);
      var ti = fTopo.value === "" ? -1 : s.topologies.indexOf(fTopo.value);
      var lo = Math.max(0, bound(fFrom, 0)), hi = Math.min(s.n - 1, bound(fTo, s.n - 1));
      matches = [];
      for (var i = lo; i <= hi; i++) {
        if ((st < 0 || s.status[i] === st) && (ti < 0 || s.topology[i] === ti)) matches.push(i);
      }
      page = 0;
      render();
    }

    function render() {
      var pages = Math.max(1, Math.ceil(matches.length / PAGE_ROWS));
      page = Math.min(Math.max(page, 0), pages - 1);
      var a = page * PAGE_ROWS, b = Math.min(matches.length, a + PAGE_ROWS);
      byId("count").textContent = matches.length + " of " + s.n + " steps" +
        (matches.length ? "; showing " + (a + 1) + "\u2013" + b : "");
      byId("page").textContent = "page " + (page + 1) + " of " + pages;
      byId("prev").disabled = page === 0;
      byId("next").disabled = page >= pages - 1;
      var body = document.querySelector("#steps tbody");
      clear(body);
      for (var j = a; j < b; j++) {
        var i = matches[j], code = s.status[i];
        var tr = el("tr", {cls: "row-" + code}, [
          el("td", {}, [stepLink(i)]),
          el("td", {text: s.topologies[s.topology[i]]}),
          el("td", {text: s.windows[i]}),
          el("td", {text: s.tokens[i]}),
          el("td", {text: s.loss[i]}),
          el("td", {text: s.skipped[i] ? "skipped" : ""}),
          el("td", {cls: "status-" + code, text: s.labels[s.label[i]]})]);
        tr.setAttribute("data-step", String(i));
        body.appendChild(tr);
      }
    }

    [fStatus, fTopo, fFrom, fTo].forEach(function (f) { f.addEventListener("change", filter); });
    byId("f-reset").addEventListener("click", function () {
      fStatus.value = fTopo.value = fFrom.value = fTo.value = "";
      filter();
    });
    byId("prev").addEventListener("click", function () { page -= 1; render(); });
    byId("next").addEventListener("click", function () { page += 1; render(); });
    filter();
  }

  // -- the step view --------------------------------------------------------------------------------------------
  var DIGESTS = ["forward", "backward", "reduced", "clipped", "optimizer"];  // computation order
  var FIELDS = ["topology", "windows", "tokens", "accum", "loss", "ce", "z", "grad_norm", "clip_coef", "lr",
                "skipped", "spike_trigger", "expert_load"];

  function kv(rows) {
    return el("table", {cls: "kv"}, rows.map(function (r) {
      return el("tr", {}, [el("th", {text: r[0]}), el("td", {cls: r[2] || "", text: r[1]})]);
    }));
  }

  function show(value) { return typeof value === "object" ? JSON.stringify(value) : String(value); }

  function certVerdict(c, step) {
    if (c.verdict !== "MISMATCH") return c.verdict;
    if (step < c.mismatch_step) return "MATCH (before its divergence at step " + c.mismatch_step + ")";
    if (step === c.mismatch_step) return "MISMATCH";
    return "not certified (after its divergence at step " + c.mismatch_step + ")";
  }

  function mismatchBox(c) {
    var box = el("div", {cls: "mismatch"}, [
      el("p", {}, [el("strong", {text: "MISMATCH on " + c.kind_label + " at stage " + c.mismatch_stage})]),
      el("p", {cls: "note", text: "certificate of steps " + c.first_step + ".." + (c.end_step - 1) + ", job " +
                                  c.job_id + " (" + c.file + ")"})]);
    if (c.parts) {
      box.appendChild(kv([["tensor", c.parts.tensor], ["first differing element", c.parts.element],
                          ["expected (the run)", c.parts.expected], ["replay", c.parts.replay],
                          ["elements differing", c.parts.differing]]));
    } else {
      box.appendChild(el("p", {cls: "note", text: "tensor: not named (this stage compares digests, or the run kept " +
                                                  "no checkpoint after the step)"}));
    }
    box.appendChild(el("pre", {text: c.mismatch_detail || ""}));
    return box;
  }

  function certificatesTable(certs, step) {
    var head = ["job", "kind", "verdict at this step", "segment", "replayed from", "machine", "finished", "replay it"];
    var t = el("table", {cls: "grid"}, [el("tr", {}, head.map(function (h) { return el("th", {text: h}); }))]);
    certs.forEach(function (c) {
      var v = certVerdict(c, step);
      var code = v === "MISMATCH" ? 2 : v.indexOf("MATCH") === 0 ? 1 : v === "REFUSED" ? 3 : 0;
      var machine = [c.device + " (" + c.device_name + ")", c.backend, c.cpu_isa, "host " + c.hostname];
      t.appendChild(el("tr", {}, [
        el("td", {text: c.job_id}), el("td", {text: c.kind_label}), el("td", {cls: "status-" + code, text: v}),
        el("td", {text: c.first_step + ".." + (c.end_step - 1)}),
        el("td", {text: c.start_checkpoint ? "checkpoint " + c.start_checkpoint : "init"}),
        el("td", {}, machine.map(function (m) { return el("div", {text: m}); })),
        el("td", {text: c.time}), el("td", {}, [el("code", {text: c.command})])]));
    });
    return t;
  }

  function documentsSection(rec, run) {
    var sec = el("section", {}, [el("h2", {text: "Documents"})]);
    var d = rec.documents;
    if (!d) {
      var why = run.documents_note ||
        ("documents are listed for steps " + run.documents_steps[0] + ".." + (run.documents_steps[1] - 1) +
         " and the MISMATCH steps; build the site again with --documents-steps " + rec.step + ":" + (rec.step + 1) +
         " to list this step's, or print them:");
      sec.appendChild(el("p", {cls: "note", text: why}));
      if (!run.documents_note) sec.appendChild(el("pre", {text: run.inspect_command + rec.step}));
      return sec;
    }
    sec.appendChild(el("p", {cls: "note", text: "windows [" + d.windows[0] + ", " + d.windows[1] + "): each window's " +
      "tokens, piece by piece, with the document each piece comes from and the text its tokens decode to"}));
    var byWindow = {};
    d.pieces.forEach(function (p) { (byWindow[p.window] = byWindow[p.window] || []).push(p); });
    Object.keys(byWindow).map(Number).sort(function (a, b) { return a - b; }).forEach(function (w) {
      sec.appendChild(el("h3", {cls: "window", text: "window " + w}));
      var head = ["source", "shard", "document", "id", "tokens of the document", "span in the shard", "text"];
      var t = el("table", {cls: "grid docs"}, [el("tr", {}, head.map(function (h) { return el("th", {text: h}); }))]);
      byWindow[w].forEach(function (p) {
        var unit = p.span_unit === "row" ? "rows " : "bytes ";
        t.appendChild(el("tr", {}, [
          el("td", {text: p.source}), el("td", {text: p.shard}), el("td", {text: p.document}),
          el("td", {text: p.id === null || p.id === undefined ? "" : p.id}),
          el("td", {text: "[" + p.tokens[0] + ", " + p.tokens[1] + ") of " + p.doc_tokens}),
          el("td", {text: unit + "[" + p.span[0] + ", " + p.span[1] + ")"}),
          el("td", {}, [el("pre", {cls: "excerpt", text: p.text + (p.cut ? " \u2026" : "")})])]));
      });
      sec.appendChild(t);
    });
    return sec;
  }

  function renderStep(view, rec, run) {
    clear(view);
    var step = rec.step;
    document.title = "step " + step + " \u2014 " + run.name;
    var nav = el("p", {}, []);
    if (step > 0) nav.appendChild(el("a", {href: "step.html?step=" + (step - 1), text: "\u2190 step " + (step - 1)}));
    nav.appendChild(document.createTextNode(" "));
    if (step + 1 < run.n_steps) {
      nav.appendChild(el("a", {href: "step.html?step=" + (step + 1), text: "step " + (step + 1) + " \u2192"}));
    }
    view.appendChild(el("h1", {text: "Step " + step}));
    view.appendChild(nav);
    view.appendChild(el("p", {cls: "status-" + rec.status + " count", text: "audit status: " + rec.label}));

    var all = data.certificates || [];
    var certs = all.filter(function (c) { return c.first_step <= step && step < c.end_step; });
    // a segment that starts on a checkpoint disagreeing with the log diverges at the step before it: shown there too
    all.filter(function (c) { return c.verdict === "MISMATCH" && c.mismatch_step === step; })
      .forEach(function (c) { view.appendChild(mismatchBox(c)); });

    view.appendChild(el("h2", {text: "Record (hashlog.jsonl)"}));
    view.appendChild(kv(FIELDS.filter(function (f) { return f in rec.record; })
      .map(function (f) { return [f, show(rec.record[f])]; })));
    view.appendChild(el("h2", {text: "State and chain"}));
    view.appendChild(kv([["state hash", rec.record.state_hash, "hash"], ["chain hash", rec.record.chain_hash, "hash"],
                         ["previous chain hash", rec.prev_chain, "hash"]]));
    view.appendChild(el("p", {cls: "note", text: "chain hash = blake3(previous chain hash | state hash)"}));
    view.appendChild(el("h2", {text: "Stage digests"}));
    var digests = rec.record.digests || {};
    var names = DIGESTS.filter(function (n) { return n in digests; })
      .concat(Object.keys(digests).filter(function (n) { return DIGESTS.indexOf(n) < 0; }).sort());
    view.appendChild(names.length ? kv(names.map(function (n) { return [n, digests[n], "hash"]; }))
                                   : el("p", {cls: "note", text: "the run logged no stage digests"}));
    view.appendChild(el("h2", {text: "Certificates"}));
    view.appendChild(certs.length ? certificatesTable(certs, step)
                                  : el("p", {cls: "note", text: "no certificate covers this step"}));
    view.appendChild(documentsSection(rec, run));
  }

  function stepPage() {
    var run = data.run, view = byId("step-view");
    var text = new URLSearchParams(location.search).get("step") || "0";
    var step = /^\d+$/.test(text) ? parseInt(text, 10) : -1;
    if (step < 0 || step >= run.n_steps) {
      clear(view);
      var last = run.n_steps - 1;
      view.appendChild(el("p", {cls: "note", text: "no step " + text + ": the run logged steps 0.." + last}));
      return;
    }
    var k = Math.floor(step / run.chunk), name = "chunk-" + k;
    loadScript("data/steps/" + String(k).padStart(6, "0") + ".js").then(function () {
      renderStep(view, data[name].steps[step - data[name].first], run);
    }, function (err) {
      clear(view);
      view.appendChild(el("p", {cls: "note", text: err.message}));
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    var page = document.body.getAttribute("data-page");
    if (page === "steps") stepsPage();
    if (page === "step") stepPage();
  });

  return {receive: receive};
})();

// gd2fs console: refreshes the page in place. It fetches the page's view as
// JSON (/ui/api/<page>) and lays it out exactly as templates/page.html does,
// putting every figure and name in the DOM as text (textContent), never as
// markup. No framework, no build step.
"use strict";
(function () {
  var page = document.body.dataset.page;
  if (!page) return;
  var every = 5000, paused = false, n = 0, timer = null;
  var svgNS = "http://www.w3.org/2000/svg";

  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    for (var k in attrs || {}) if (attrs[k] !== undefined && attrs[k] !== "") e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function svg(tag, attrs) {
    var e = document.createElementNS(svgNS, tag);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    return e;
  }
  // Links only ever lead inside the console.
  function safeHref(h) { return typeof h === "string" && h.indexOf("/ui/") === 0 && h.indexOf("//") !== 0 ? h : ""; }

  function stats(list) {
    var d = el("div", { class: "stats" });
    list.forEach(function (s) {
      var t = el("div", { class: "stat", id: s.id });
      t.appendChild(el("div", { class: "label" }, s.label));
      t.appendChild(el("div", { class: "value" }, s.value));
      if (s.meter !== undefined && s.meter !== null) t.appendChild(el("meter", { min: "0", max: "1", value: String(s.meter) }));
      if (s.sub) t.appendChild(el("div", { class: "sub" }, s.sub));
      d.appendChild(t);
    });
    return d;
  }
  function charts(list) {
    var d = el("div", { class: "charts" });
    list.forEach(function (c) {
      var f = el("figure", { class: "chart", id: c.id });
      f.appendChild(el("figcaption", {}, c.title));
      var s = svg("svg", { viewBox: "0 0 300 80", preserveAspectRatio: "none", role: "img", "aria-label": c.title });
      s.appendChild(svg("line", { class: "axis", x1: "0", y1: "80", x2: "300", y2: "80" }));
      (c.lines || []).forEach(function (l) { s.appendChild(svg("path", { class: l.class, d: l.d })); });
      f.appendChild(s);
      var sc = el("div", { class: "scale" });
      sc.appendChild(el("span", {}, "max " + c.ymax));
      sc.appendChild(el("span", {}, c.span));
      f.appendChild(sc);
      var ul = el("ul", { class: "legend" });
      (c.lines || []).forEach(function (l) {
        var li = el("li", { class: l.class }, l.name + " ");
        li.appendChild(el("b", {}, l.last));
        ul.appendChild(li);
      });
      f.appendChild(ul);
      if (c.empty) f.appendChild(el("p", { class: "muted" }, c.empty));
      d.appendChild(f);
    });
    return d;
  }
  function bar(b) {
    var f = el("figure", { class: "bar", id: b.id });
    var s = svg("svg", { viewBox: "0 0 100 10", preserveAspectRatio: "none", role: "img", "aria-label": b.axis });
    (b.rects || []).forEach(function (r) {
      var rect = svg("rect", { class: r.class, x: String(r.x), y: "0", width: String(r.w), height: "10" });
      var t = document.createElementNS(svgNS, "title");
      t.textContent = r.title;
      rect.appendChild(t);
      s.appendChild(rect);
    });
    f.appendChild(s);
    f.appendChild(el("figcaption", {}, b.axis));
    return f;
  }
  function table(t) {
    var w = el("div", { class: "tablewrap" });
    var tb = el("table", { id: t.id });
    var hr = el("tr");
    (t.head || []).forEach(function (h) { hr.appendChild(el("th", {}, h)); });
    tb.appendChild(el("thead")).appendChild(hr);
    var body = tb.appendChild(el("tbody"));
    var rows = t.rows || [];
    if (!rows.length) {
      var tr = body.appendChild(el("tr"));
      tr.appendChild(el("td", { colspan: String((t.head || []).length), class: "muted" }, t.empty || ""));
    }
    rows.forEach(function (r) {
      var tr = body.appendChild(el("tr"));
      r.forEach(function (c) {
        var td = el("td", { class: c.class, title: c.title });
        var href = safeHref(c.href);
        if (href) td.appendChild(el("a", { href: href }, c.text));
        else td.textContent = c.text;
        tr.appendChild(td);
      });
    });
    w.appendChild(tb);
    return w;
  }
  function render(v) {
    var main = document.getElementById("main");
    var frag = document.createDocumentFragment();
    var bn = el("div", { id: "banners" });
    (v.banners || []).forEach(function (b) { bn.appendChild(el("p", { class: "banner " + b.level, role: "alert" }, b.text)); });
    frag.appendChild(bn);
    (v.sections || []).forEach(function (s) {
      var sec = el("section", { id: s.id });
      sec.appendChild(el("h2", {}, s.title));
      if (s.note) sec.appendChild(el("p", { class: "note" }, s.note));
      if (s.stats && s.stats.length) sec.appendChild(stats(s.stats));
      if (s.charts && s.charts.length) sec.appendChild(charts(s.charts));
      if (s.bar) sec.appendChild(bar(s.bar));
      if (s.table) sec.appendChild(table(s.table));
      frag.appendChild(sec);
    });
    main.replaceChildren(frag);
    document.getElementById("updated").textContent = v.updated;
    document.getElementById("hdr-epoch").textContent = String(v.epoch);
  }
  function problem(text) {
    var bn = document.getElementById("banners");
    if (!bn) return;
    var old = document.getElementById("refresh-error");
    if (old) old.remove();
    var p = el("p", { class: "banner error", role: "alert", id: "refresh-error" }, text);
    bn.appendChild(p);
  }
  function refresh() {
    timer = null;
    fetch("/ui/api/" + page + location.search, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) {
        if (r.status === 401) { location.reload(); return null; }
        if (!r.ok) throw new Error("the master answered " + r.status);
        return r.json();
      })
      .then(function (v) {
        if (!v) return;
        render(v);
        document.body.dataset.refreshed = String(++n);
      })
      .catch(function (e) { problem("refresh failed: " + e.message + " (retrying)"); })
      .then(schedule);
  }
  function schedule() { if (!paused && timer === null) timer = setTimeout(refresh, every); }
  var btn = document.getElementById("pause");
  btn.hidden = false;
  btn.addEventListener("click", function () {
    paused = !paused;
    btn.textContent = paused ? "resume" : "pause";
    if (paused && timer !== null) { clearTimeout(timer); timer = null; }
    if (!paused) refresh();
  });
  // A test or an impatient operator can ask for the first refresh sooner.
  var first = Number(new URLSearchParams(location.hash.slice(1)).get("refresh"));
  timer = setTimeout(refresh, first > 0 ? first : every);
})();

// agentfsm audit --html: show the state after a move; open the records when a line link is followed.
(function () {
  "use strict";
  var data = {};
  document.querySelectorAll("script.run-data").forEach(function (el) {
    var run = JSON.parse(el.textContent);
    data[run.key] = run;
  });

  function show(key, n) {
    var run = data[key];
    var panel = document.querySelector('.state[data-run="' + key + '"]');
    if (!run || !panel) { return; }
    var move = run.moves[n - 1];
    var before = n > 1 ? run.moves[n - 2].state : null;
    document.querySelectorAll('[data-run="' + key + '"][data-move]').forEach(function (el) {
      el.classList.toggle("selected", String(el.dataset.move) === String(n));
    });
    var head = document.createElement("p");
    head.className = "state-head";
    head.textContent = "after move " + move.n + ": " + move.label + " (" + move.source + " → " + move.dest +
      "), line " + move.line + (move.reason ? ", terminal reason " + move.reason : "");
    var table = document.createElement("table");
    table.className = "state-table";
    var changed = {};
    move.changed.forEach(function (k) { changed[k] = true; });
    Object.keys(move.state).forEach(function (k) {
      var tr = document.createElement("tr");
      if (changed[k]) { tr.className = "changed"; }
      var name = document.createElement("th");
      name.textContent = k;
      var value = document.createElement("td");
      value.textContent = JSON.stringify(move.state[k]);
      var was = document.createElement("td");
      was.className = "was";
      if (changed[k] && before) { was.textContent = "was " + JSON.stringify(before[k]); }
      tr.appendChild(name); tr.appendChild(value); tr.appendChild(was);
      table.appendChild(tr);
    });
    var summary = document.createElement("p");
    summary.className = "note";
    summary.textContent = move.changed.length ? "changed: " + move.changed.join(", ") : "nothing changed";
    panel.replaceChildren(head, summary, table);
  }

  document.addEventListener("click", function (ev) {
    var el = ev.target.closest("[data-move]");
    if (el && el.dataset.run) { show(el.dataset.run, Number(el.dataset.move)); }
  });
  document.addEventListener("keydown", function (ev) {
    var el = ev.target.closest && ev.target.closest("tr[data-move]");
    if (el && (ev.key === "Enter" || ev.key === " ")) { ev.preventDefault(); show(el.dataset.run, Number(el.dataset.move)); }
  });

  function reveal() {
    var id = decodeURIComponent(location.hash.slice(1));
    var target = id && document.getElementById(id);
    if (!target) { return; }
    for (var p = target.parentElement; p; p = p.parentElement) {
      if (p.tagName === "DETAILS") { p.open = true; }
    }
    document.querySelectorAll(".lines li.hit").forEach(function (li) { li.classList.remove("hit"); });
    if (target.tagName === "LI") { target.classList.add("hit"); }
    target.scrollIntoView({block: "center"});
  }
  window.addEventListener("hashchange", reveal);
  reveal();
})();

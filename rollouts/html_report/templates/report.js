
(function () {
  "use strict";
  var table = document.getElementById("tasks");
  if (table && table.tHead && table.tBodies.length) {
    var body = table.tBodies[0];
    var heads = table.tHead.rows[0].cells;
    var keyOf = function (td, num) {
      var v = td ? td.getAttribute("data-sort") : null;
      if (!num) { return v === null ? "" : v; }
      var x = parseFloat(v);
      return isNaN(x) ? null : x;
    };
    var sortBy = function (col) {
      var th = heads[col];
      var num = th.getAttribute("data-type") === "num";
      var dir = th.getAttribute("aria-sort") === "ascending" ? -1 : 1;
      for (var i = 0; i < heads.length; i++) { heads[i].removeAttribute("aria-sort"); }
      th.setAttribute("aria-sort", dir === 1 ? "ascending" : "descending");
      var rows = Array.prototype.slice.call(body.rows);
      rows.sort(function (a, b) {
        var x = keyOf(a.cells[col], num), y = keyOf(b.cells[col], num), c;
        if (num) {
          if (x === null || y === null) { c = (x === null) - (y === null); }  // blanks last, both ways
          else { c = dir * (x < y ? -1 : x > y ? 1 : 0); }
        } else { c = dir * x.localeCompare(y); }
        return c || (+a.getAttribute("data-index") - +b.getAttribute("data-index"));
      });
      var frag = document.createDocumentFragment();
      rows.forEach(function (r) { frag.appendChild(r); });
      body.appendChild(frag);
    };
    Array.prototype.forEach.call(heads, function (th, col) {
      th.addEventListener("click", function () { sortBy(col); });
      th.addEventListener("keydown", function (ev) {
        if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); sortBy(col); }
      });
    });
    var m = /^#sort=([A-Za-z0-9_.,-]+)$/.exec(location.hash);
    if (m) {
      m[1].split(",").forEach(function (key) {
        var th = table.tHead.querySelector('th[data-key="' + key + '"]');
        if (th) { th.click(); }
      });
    }
  }
  document.documentElement.setAttribute("data-report-ready", "1");
})();

(function () {
  var dark = window.matchMedia('(prefers-color-scheme: dark)');
  function colors(isDark) {
    return isDark ? {fg: '#e8e8ea', grid: '#3a3d43'} : {fg: '#1d1d1f', grid: '#e1e4e8'};
  }
  function theme(layout, isDark) {
    var c = colors(isDark), update = {'font.color': c.fg, 'legend.font.color': c.fg};
    Object.keys(layout).forEach(function (key) {
      if (/^[xy]axis\d*$/.test(key)) {
        update[key + '.gridcolor'] = c.grid; update[key + '.zerolinecolor'] = c.grid;
        update[key + '.linecolor'] = c.grid;
      }
    });
    return update;
  }
  function apply(layout, update) {
    Object.keys(update).forEach(function (path) {
      var parts = path.split('.'), node = layout;
      for (var i = 0; i < parts.length - 1; i++) { node[parts[i]] = node[parts[i]] || {}; node = node[parts[i]]; }
      node[parts[parts.length - 1]] = update[path];
    });
    return layout;
  }
  var plots = [];
  document.querySelectorAll('script.figure').forEach(function (block) {
    var spec = JSON.parse(block.textContent), div = document.getElementById(block.dataset.target);
    var layout = apply(spec.layout, theme(spec.layout, dark.matches));
    Plotly.newPlot(div, spec.data, layout, {displaylogo: false, responsive: true});
    if (spec.links) {
      div.on('plotly_click', function (event) {
        var target = event.points[0].customdata; if (target) { window.location.hash = target; }
      });
    }
    plots.push(div);
  });
  // Printing needs no event (headless printToPDF fires none): each chart keeps in
  // --print-zoom the zoom that fits its screen width onto an A4 page (182 mm = 688 px).
  function fit() {
    plots.forEach(function (div) {
      div.style.setProperty('--print-zoom', Math.min(1, 680 / Math.max(div.offsetWidth, 1)));
    });
  }
  fit();
  window.addEventListener('resize', fit);
  function retheme(isDark) {
    plots.forEach(function (div) { Plotly.relayout(div, theme(div.layout, isDark)); });
  }
  window.addEventListener('beforeprint', function () { retheme(false); });
  window.addEventListener('afterprint', function () { retheme(dark.matches); });
  dark.addEventListener('change', function (event) { retheme(event.matches); });
})();

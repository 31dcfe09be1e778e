// The interactive elements of the page, in document order, each tagged with
// data-sandmesh-index so that click/fill {index} find it again (until the next navigation;
// a new listing renumbers). Hidden and zero-size elements are skipped.
(max) => {
  const interactive = 'a[href], button, input:not([type=hidden]), select, textarea, summary, ' +
    '[role=button], [role=link], [role=checkbox], [role=radio], [role=tab], [role=menuitem], ' +
    '[role=textbox], [contenteditable=""], [contenteditable=true], [onclick], [tabindex]';
  for (const e of document.querySelectorAll('[data-sandmesh-index]')) {
    e.removeAttribute('data-sandmesh-index');
  }
  const implied = (tag, type) => {
    if (tag === 'a') return 'link';
    if (tag === 'button' || tag === 'summary') return 'button';
    if (tag === 'select') return 'combobox';
    if (tag === 'textarea') return 'textbox';
    if (tag === 'input') {
      if (['submit', 'button', 'reset', 'image'].includes(type)) return 'button';
      return { checkbox: 'checkbox', radio: 'radio', range: 'slider', search: 'searchbox' }[type]
        || 'textbox';
    }
    return 'generic';
  };
  const out = [];
  for (const e of document.querySelectorAll(interactive)) {
    if (out.length >= max) break;
    const r = e.getBoundingClientRect();
    const style = getComputedStyle(e);
    if ((r.width === 0 && r.height === 0) || style.visibility === 'hidden' || style.display === 'none') {
      continue;
    }
    const tag = e.tagName.toLowerCase();
    const type = tag === 'input' ? (e.getAttribute('type') || 'text').toLowerCase() : null;
    const labels = e.labels ? Array.from(e.labels).map((l) => l.innerText).join(' ') : '';
    const buttonValue = tag === 'input' && ['submit', 'button', 'reset'].includes(type) ? e.value : '';
    const name = (e.getAttribute('aria-label') || labels || buttonValue || e.innerText ||
      e.getAttribute('placeholder') || e.getAttribute('title') || e.getAttribute('alt') ||
      e.getAttribute('name') || '').replace(/\s+/g, ' ').trim().slice(0, 100);
    e.setAttribute('data-sandmesh-index', String(out.length));
    out.push({ index: out.length, tag, role: e.getAttribute('role') || implied(tag, type), name, input_type: type });
  }
  return out;
}

// sandmesh console: keeps the page live over Server-Sent Events and posts decisions without
// reloading. Every piece of HTML it inserts was rendered and escaped by the server; this
// script never builds markup from data.
'use strict';
(function () {
  const pending = document.getElementById('pending');
  const decided = document.getElementById('decided');
  const audit = document.querySelector('table.audit tbody');
  const live = document.getElementById('live');
  const KEEP_DECIDED = 50;

  function fragment(html) {
    const t = document.createElement('template');
    t.innerHTML = html;
    return t.content.firstElementChild;
  }

  function refreshCount() {
    if (!pending) return;
    const n = pending.querySelectorAll('article.card').length;
    const count = document.getElementById('count');
    if (count) count.textContent = String(n);
    const empty = document.getElementById('empty');
    if (empty) empty.hidden = n > 0;
    document.title = (n ? '(' + n + ') ' : '') + 'Pending · sandmesh console';
  }

  function onCard(ev) {
    if (!pending) return;
    const d = JSON.parse(ev.data);
    const node = fragment(d.html);
    if (!node) return;
    const old = document.getElementById('c-' + d.id);
    if (d.state === 'pending') {
      if (old && old.parentNode === pending) old.replaceWith(node);
      else if (!old) pending.prepend(node);
    } else {
      if (old) old.remove();
      decided.prepend(node);
      while (decided.children.length > KEEP_DECIDED) decided.lastElementChild.remove();
    }
    refreshCount();
    tick();
  }

  // After (re)connecting: cards no longer pending were decided while the stream was down.
  function onSync(ev) {
    if (!pending) return;
    const ids = new Set(JSON.parse(ev.data).pending);
    for (const card of Array.from(pending.querySelectorAll('article.card'))) {
      if (!ids.has(card.dataset.id)) card.remove();
    }
    refreshCount();
  }

  function onAudit(ev) {
    if (!audit) return;
    const d = JSON.parse(ev.data);
    const wanted = new URLSearchParams(location.search).get('session');
    if (wanted ? d.session !== wanted : d.kind !== 'finished') return;
    const t = document.createElement('template');
    t.innerHTML = '<table><tbody>' + d.html + '</tbody></table>';
    const row = t.content.querySelector('tr');
    if (row) audit.prepend(row);
  }

  function tick() {
    const now = Date.now();
    for (const el of document.querySelectorAll('article.card.pending')) {
      const left = Math.max(0, Math.floor((Number(el.dataset.expires) - now) / 1000));
      const span = el.querySelector('.left');
      if (!span) continue;
      span.textContent = left > 0
        ? Math.floor(left / 60) + ':' + String(left % 60).padStart(2, '0') + ' left'
        : 'expired';
      span.classList.toggle('urgent', left < 30);
    }
  }

  let source = null;
  function connect() {
    if (!live) return;
    source = new EventSource('/events');
    source.addEventListener('open', function () {
      live.textContent = 'live';
      live.className = 'live on';
    });
    source.addEventListener('card', onCard);
    source.addEventListener('sync', onSync);
    source.addEventListener('audit', onAudit);
    // Fallen behind: start over with the whole list.
    source.addEventListener('resync', function () {
      source.close();
      connect();
    });
    source.addEventListener('error', function () {
      live.textContent = 'reconnecting…';
      live.className = 'live off';
      if (source.readyState === EventSource.CLOSED) {
        // The browser gave up (an error status): logged out, or the console is down.
        setTimeout(function () {
          fetch('/api/whoami', { credentials: 'same-origin' }).then(function (r) {
            if (r.status === 401) location.assign('/login');
            else connect();
          }, function () { connect(); });
        }, 1000);
      }
    });
  }

  // Decisions go over fetch so the page (and its stream) stays; the card changes when the
  // decision comes back as an event, on this page and every other.
  document.addEventListener('submit', function (ev) {
    const form = ev.target;
    if (!(form instanceof HTMLFormElement) || form.getAttribute('action') !== '/decide') return;
    ev.preventDefault();
    const body = new URLSearchParams(new FormData(form, ev.submitter));
    const card = form.closest('article.card');
    const error = card && card.querySelector('.card-error');
    for (const b of form.querySelectorAll('button')) b.disabled = true;
    fetch('/decide', {
      method: 'POST',
      body: body,
      credentials: 'same-origin',
      headers: { 'X-Sandmesh-Fetch': '1' },
    }).then(function (r) {
      if (r.ok) return;
      return r.text().then(function (text) {
        if (error) { error.textContent = text; error.hidden = false; }
        for (const b of form.querySelectorAll('button')) b.disabled = false;
      });
    }, function (e) {
      if (error) { error.textContent = String(e); error.hidden = false; }
      for (const b of form.querySelectorAll('button')) b.disabled = false;
    });
  });

  refreshCount();
  tick();
  setInterval(tick, 1000);
  connect();
})();

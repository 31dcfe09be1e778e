// The rendered page under `root` as Markdown, at most `limit` characters: run in the page by
// `GET /v1/browser/page/markdown` (page.rs). It reads the live DOM, so what scripts built is
// there and what CSS hides is not. Headings, paragraphs, emphasis, code, links, images, lists,
// quotes and tables become Markdown; other elements give their text.
((root, limit) => {
  const skipped = new Set(['SCRIPT', 'STYLE', 'NOSCRIPT', 'TEMPLATE', 'HEAD', 'svg', 'CANVAS',
    'IFRAME', 'OBJECT', 'EMBED', 'INPUT', 'SELECT', 'TEXTAREA']);
  const blocks = new Set(['P', 'DIV', 'SECTION', 'ARTICLE', 'MAIN', 'HEADER', 'FOOTER', 'NAV',
    'ASIDE', 'FORM', 'FIELDSET', 'FIGURE', 'FIGCAPTION', 'DL', 'DT', 'DD', 'ADDRESS', 'DETAILS',
    'SUMMARY', 'BODY', 'HTML']);
  const escape = (t) => t.replace(/([\\`*_[\]])/g, '\\$1');
  const hidden = (el) => {
    const s = getComputedStyle(el);
    return s.display === 'none' || s.visibility === 'hidden';
  };
  const children = (node) => [...node.childNodes].map(convert).join('');
  const spaced = (t) => '\n\n' + t.trim() + '\n\n';
  const wrap = (node, mark) => {
    const t = children(node).trim();
    return t ? mark + t + mark : '';
  };
  const list = (node) => {
    let n = node.tagName === 'OL' ? Number(node.getAttribute('start') || 1) : 0;
    const items = [...node.children].filter((li) => li.tagName === 'LI').map((li) => {
      const bullet = n ? `${n++}. ` : '- ';
      const body = children(li).trim().replace(/\n{2,}/g, '\n');
      return bullet + body.split('\n').join('\n' + ' '.repeat(bullet.length));
    });
    return '\n\n' + items.join('\n') + '\n\n';
  };
  const table = (node) => {
    const rows = [...node.rows].map((r) => '| ' + [...r.cells]
      .map((c) => children(c).trim().replace(/\s*\n\s*/g, ' ').replace(/\|/g, '\\|'))
      .join(' | ') + ' |');
    if (!rows.length) return '';
    const width = node.rows[0].cells.length;
    rows.splice(1, 0, '|' + ' --- |'.repeat(width));
    return '\n\n' + rows.join('\n') + '\n\n';
  };
  const convert = (node) => {
    if (node.nodeType === Node.TEXT_NODE) return escape(node.textContent.replace(/\s+/g, ' '));
    if (node.nodeType !== Node.ELEMENT_NODE) return '';
    const tag = node.tagName;
    if (skipped.has(tag) || hidden(node)) return '';
    switch (tag) {
      case 'H1': case 'H2': case 'H3': case 'H4': case 'H5': case 'H6':
        return spaced('#'.repeat(Number(tag[1])) + ' ' + children(node).trim());
      case 'BR': return '  \n';
      case 'HR': return '\n\n---\n\n';
      case 'STRONG': case 'B': return wrap(node, '**');
      case 'EM': case 'I': return wrap(node, '_');
      case 'CODE': return '`' + node.textContent + '`';
      case 'PRE': return '\n\n```\n' + node.textContent.replace(/\n$/, '') + '\n```\n\n';
      case 'A': {
        const text = children(node).trim();
        return node.getAttribute('href') && text ? `[${text}](${node.href})` : text;
      }
      case 'IMG':
        return node.src ? `![${escape(node.getAttribute('alt') || '')}](${node.src})` : '';
      case 'UL': case 'OL': return list(node);
      case 'TABLE': return table(node);
      case 'BLOCKQUOTE':
        return '\n\n' + children(node).trim().split('\n').map((l) => '> ' + l).join('\n') + '\n\n';
      default: return blocks.has(tag) ? spaced(children(node)) : children(node);
    }
  };
  const markdown = convert(root).replace(/[ \t]+\n/g, (m) => (m.startsWith('  ') ? '  \n' : '\n'))
    .replace(/\n{3,}/g, '\n\n').trim();
  return { markdown: markdown.slice(0, limit), truncated: markdown.length > limit };
})

// Building DOM nodes without ever parsing HTML: text goes in as text nodes, attributes are
// set one by one, handlers are functions. Job payloads, error messages, worker ids and
// queue names are all attacker-controlled, and nothing here can turn them into markup.
// (The page's CSP also enforces Trusted Types, so assigning a string to innerHTML throws.)

const SVG_NS = "http://www.w3.org/2000/svg";
const FORBIDDEN = new Set(["innerHTML", "outerHTML", "srcdoc"]);

function apply(el, attrs) {
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (FORBIDDEN.has(name)) throw new Error(`refusing to set ${name}`);
    if (name === "text") {
      el.textContent = String(value);
    } else if (name === "dataset") {
      Object.assign(el.dataset, value);
    } else if (name.startsWith("on")) {
      if (typeof value !== "function") throw new Error(`${name} must be a function`);
      el.addEventListener(name.slice(2).toLowerCase(), value);
    } else if (name === "href" && !/^(#|\/(?!\/))/.test(String(value))) {
      // only links inside the dashboard or this origin: never javascript: or data:
      throw new Error(`refusing href ${value}`);
    } else {
      el.setAttribute(name, value === true ? "" : String(value));
    }
  }
}

function append(el, children) {
  for (const child of children) {
    if (child === undefined || child === null || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else if (child instanceof Node) el.appendChild(child);
    else el.appendChild(document.createTextNode(String(child)));
  }
}

/** h("a", {href: "#/", class: "x"}, "text", otherNode, [more]) */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  apply(el, attrs);
  append(el, children);
  return el;
}

/** The same for SVG elements. */
export function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  apply(el, attrs);
  append(el, children);
  return el;
}

export function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
}

export function replace(el, ...children) {
  clear(el);
  append(el, children);
}

/** A modal confirmation (native <dialog>: focus is trapped and Escape cancels). */
export function confirmDialog({ title, body, confirm, danger = false, extra = null }) {
  return new Promise((resolve) => {
    const titleId = `dialog-title-${Math.random().toString(36).slice(2)}`;
    const ok = h("button", { type: "button", class: danger ? "danger" : "primary" }, confirm);
    const cancel = h("button", { type: "button" }, "Cancel");
    const dialog = h(
      "dialog",
      { "aria-labelledby": titleId },
      h("h2", { id: titleId }, title),
      [].concat(body).map((text) => h("p", null, text)),
      extra,
      h("div", { class: "actions" }, cancel, ok),
    );
    let answer = false;
    ok.addEventListener("click", () => {
      answer = true;
      dialog.close();
    });
    cancel.addEventListener("click", () => dialog.close());
    dialog.addEventListener("close", () => {
      dialog.remove();
      resolve(answer);
    });
    document.body.appendChild(dialog);
    dialog.showModal();
    cancel.focus();
  });
}

/** A table in its scrolling wrapper. `table`: the table's attributes (an id or a class);
 * `caption`: read to screen readers only, unless `showCaption`; `heads`: the header cells
 * (a string is a plain column header; nested lists and nulls are allowed); `rows`: the
 * body's rows. */
export function dataTable({ table = null, caption, showCaption = false, heads, rows }) {
  const cells = heads.flat().map((c) => (typeof c === "string" ? h("th", { scope: "col" }, c) : c));
  return h(
    "div",
    { class: "table-wrap" },
    h(
      "table",
      table,
      h("caption", showCaption ? null : { class: "sr-only" }, caption),
      h("thead", null, h("tr", null, cells)),
      h("tbody", null, rows),
    ),
  );
}

/** Previous / next over a keyset-paginated list; `stack` holds the `after` of earlier pages. */
export function keysetPager({ next, stack, after, go, label, shown }) {
  const previous = h("button", { type: "button", "data-focus-key": `${label}:previous`, disabled: !after }, "← Previous");
  const following = h("button", { type: "button", "data-focus-key": `${label}:next`, disabled: !next }, "Next →");
  previous.addEventListener("click", () => go(stack.length ? stack.pop() : ""));
  following.addEventListener("click", () => {
    stack.push(after || "");
    go(next);
  });
  return h("nav", { class: "pager", "aria-label": `${label} pages` }, previous, h("span", { class: "muted" }, `Page ${after ? stack.length + 1 : 1} · ${shown} shown`), following);
}

// wsnmom admin page: polls the admin API and renders it; admins get actions.
// Served from the package; no external code.  Every value from the API is inserted as
// text (textContent), never as markup.
"use strict";
(() => {
  const API = "wsn/admin/api/";
  const params = new URLSearchParams(location.search);
  const REFRESH = Math.max(0, Number(params.get("refresh") ?? 2)) * 1000;
  let session = { admin: false, read: false, sign_in: false, csrf: null };
  let timer = null;
  let loading = false;
  let again = false;  // asked for while a refresh ran: one more refresh when it ends
  let refreshes = 0;
  // the subscriptions table's query: searched, sorted and paged by the gateway
  // (GET subscriptions?q=&sort=&order=&offset=&limit=); none: the overview's list
  const PAGE = 100;
  const query = { q: "", sort: "", offset: 0 };
  const previous = new Map();  // "table/id/field" -> last value shown (to flash changes)

  const $ = (id) => document.getElementById(id);

  function el(tag, props = {}, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props)) {
      if (value === undefined || value === null) continue;
      if (key === "class") node.className = value;
      else if (key === "title") node.title = value;
      else if (key.startsWith("data-")) node.setAttribute(key, value);
      else node[key] = value;
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  // -- formatting ------------------------------------------------------------------------
  const number = (n) => (n === null || n === undefined ? "?" : Number(n).toLocaleString("en-US"));
  function when(iso) {
    if (!iso) return "";
    const d = new Date(iso);
    return d.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
  }
  function relative(iso) {
    if (!iso) return "";
    const seconds = Math.round((new Date(iso).getTime() - Date.now()) / 1000);
    const span = Math.abs(seconds);
    const text = span < 90 ? `${span}s` : span < 5400 ? `${Math.round(span / 60)}min` : `${Math.round(span / 3600)}h`;
    return seconds >= 0 ? `in ${text}` : `${text} ago`;
  }
  const retry = (iso) => (!iso ? "" : new Date(iso).getTime() <= Date.now() ? "due" : relative(iso));
  const DIALECTS = {
    "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Simple": "Simple",
    "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Concrete": "Concrete",
    "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Full": "Full",
    "http://www.w3.org/TR/1999/REC-xpath-19991116": "XPath",
    "http://www.onvif.org/ver10/tev/topicExpression/ConcreteSet": "ConcreteSet",
  };
  function expression(expr) {
    if (!expr) return el("span", { class: "muted" }, "(all topics)");
    const namespaces = Object.entries(expr.namespaces || {}).map(([p, u]) => `${p} = ${u}`);
    // the namespaces of the prefixes the expression uses, shown (not only on hover)
    const used = Object.entries(expr.namespaces || {}).filter(([p]) => expr.text.includes(`${p}:`)).map(([p, u]) => `${p} = ${u}`);
    const dialect = DIALECTS[expr.dialect] || expr.dialect || "";
    return el("span", { title: [dialect, ...namespaces].join("\n") },
      el("code", {}, expr.text), el("span", { class: "namespace" }, used.join(", ")), el("span", { class: "dialect" }, dialect));
  }
  const shortId = (id) => el("span", { class: "id", title: id }, id.length > 12 ? `${id.slice(0, 10)}…` : id);

  function cell(key, cls, value, title) {
    const td = el("td", { class: cls, title }, value);
    if (key !== null && typeof value !== "object") {
      const before = previous.get(key);
      if (before !== undefined && before !== value) td.classList.add("changed");
      previous.set(key, value);
    }
    return td;
  }

  function notice(text, error = false) {
    const box = $("notice");
    box.textContent = text;
    box.className = error ? "error" : "";
    box.hidden = !text;
  }

  // -- the API ---------------------------------------------------------------------------
  async function api(path, options = {}) {
    // X-Requested-With: a 401 then comes without a challenge (no browser password dialog)
    const headers = { Accept: "application/json", "X-Requested-With": "wsnmom-admin", ...(options.headers || {}) };
    const response = await fetch(API + path, { credentials: "same-origin", cache: "no-store", ...options, headers });
    let body = null;
    try { body = await response.json(); } catch (_) { body = null; }
    return { status: response.status, body };
  }

  async function loadSession() {
    const { status, body } = await api("session");
    if (status === 200 && body) session = body;
    const acts = !!(session.admin || session.act);
    document.body.classList.toggle("admin", acts);
    const role = $("role");
    role.textContent = session.admin ? (session.caller === "admin" ? "admin" : `admin: ${session.caller}`) : (acts ? "local operator" : "read-only");
    role.className = acts ? "badge admin" : "badge";
    $("sign-in").hidden = session.admin || !session.sign_in;
    $("sign-out").hidden = !session.admin;
    $("no-access").hidden = session.read;
    $("no-access-sign-in").hidden = !session.sign_in;
    $("content").hidden = !session.read;
  }

  // the charts are drawn by the gateway (SVG): reload them when a new sample may exist
  let chartsLoaded = Date.now();
  function reloadCharts(force) {
    if (!force && Date.now() - chartsLoaded < 15000) return;
    chartsLoaded = Date.now();
    for (const img of document.querySelectorAll("img.chart")) {
      img.src = img.src.replace(/\?.*$/, "") + `?t=${chartsLoaded}`;
    }
  }

  async function refresh() {
    if (!session.read) return;
    if (loading) {
      // a click or a search during a refresh: the running one read the query before it
      again = true;
      return;
    }
    loading = true;
    try {
      const { status, body } = await api("overview");
      if (status === 200 && body) {
        render(body);
        await querySubscriptions();
        await queryDeadLetters();
        await renderDetail();
        await renderPeek();
        reloadCharts(refreshes === 0);  // the first: they may have been refused before a sign-in
        refreshes += 1;
        const stamp = $("last-refresh");
        stamp.dataset.count = String(refreshes);
        stamp.textContent = `updated ${new Date().toLocaleTimeString()}`;
      } else if (status === 401 || status === 403) {
        await loadSession();
      } else {
        $("last-refresh").textContent = `refresh failed: HTTP ${status}`;
      }
    } catch (error) {
      $("last-refresh").textContent = `gateway unreachable (${error.message || error})`;
    } finally {
      loading = false;
      if (again) {
        again = false;
        refresh();
      }
    }
  }

  // one subscription's page: /admin?subscription=ID
  const DETAIL = params.get("subscription");

  async function renderDetail() {
    if (!DETAIL) return;
    const { status, body } = await api(`subscriptions/${encodeURIComponent(DETAIL)}`);
    $("detail").hidden = false;
    $("detail-id").textContent = DETAIL;
    const rows = $("detail-fields");
    rows.replaceChildren();
    const add = (name, value) => rows.append(el("tr", { "data-field": name }, el("th", {}, name), el("td", { class: "wrap" }, value ?? "-")));
    if (status !== 200 || !body) { add("error", (body && body.error) || `HTTP ${status}`); return; }
    const d = body.delivery || {};
    const failing = d.failures > 0;
    add("address", el("code", {}, body.address));
    add("consumer", body.pull_point ? `pull point ${body.pull_point}` : el("code", {}, body.consumer));
    add("topic", expression(body.topic));
    add("message content", body.message_content ? expression(body.message_content) : "(none)");
    add("producer properties", body.producer_properties ? expression(body.producer_properties) : "(none)");
    add("policy", `${body.use_raw ? "raw (UseRaw)" : "wrapped Notify"}, SOAP ${body.soap_version}, ${body.mode}`);
    add("delivery policy", body.delivery_policy ? body.delivery_policy.summary : "-");
    add("state", el("span", { class: `badge ${failing ? "failing" : body.state}` }, failing ? "failing" : body.state));
    add("backlog", `${number(body.backlog)} (${number(body.waiting)} waiting in the middleware, ${number(d.held || 0)} in memory)`);
    add("delivered", body.delivery ? `${number(d.delivered)}${d.last_delivery ? `, last ${when(d.last_delivery)}` : ""}` : "routed into its pull point");
    add("failures", body.delivery ? number(d.failures) : "-");
    add("next retry", d.retry_at ? when(d.retry_at) : "-");
    add("last error", d.last_error || "-");
    add("created", when(body.created));
    add("ends", body.terminates ? when(body.terminates) : "never");
    const attempts = $("detail-attempts").querySelector("tbody");
    attempts.replaceChildren(...(body.attempts || []).map((a) => el("tr", {},
      el("td", {}, when(a.at)),
      el("td", {}, el("span", { class: `badge ${a.ok ? "active" : "failing"}` }, a.ok ? "delivered" : a.deferred ? "deferred" : "failed")),
      el("td", { class: "num" }, number(a.messages)),
      el("td", { class: "wrap" }, a.error || ""))));
    if (!attempts.children.length) attempts.append(el("tr", {}, el("td", { colSpan: 4, class: "muted" }, "no delivery attempt since the gateway started")));
    const letters = $("detail-dead-letters").querySelector("tbody");
    letters.replaceChildren(...(body.dead_letters || []).map((d) => el("tr", { "data-id": d.id },
      el("td", {}, when(d.time)),
      el("td", {}, d.reason),
      el("td", { class: "num" }, number(d.attempts)),
      el("td", { class: "wrap" }, el("code", {}, d.topic || "")),
      el("td", { class: "wrap" }, d.last_error || ""),
      el("td", {}, shortId(d.id)))));
    if (!letters.children.length) letters.append(el("tr", {}, el("td", { colSpan: 6, class: "muted" }, "none")));
  }

  // the first waiting messages, not consumed: /admin?subscription=ID, ?pull_point=ID or
  // ?peek=dead-letters (GET .../peek)
  const PULL_POINT = params.get("pull_point");
  const PEEK_DEAD = params.get("peek") === "dead-letters";
  const PEEK_COUNT = 20;

  function peekSource() {
    if (DETAIL) return { path: `subscriptions/${encodeURIComponent(DETAIL)}/peek`, title: `Waiting messages of subscription ${DETAIL}` };
    if (PULL_POINT) return { path: `pullpoints/${encodeURIComponent(PULL_POINT)}/peek`, title: `Waiting messages of pull point ${PULL_POINT}` };
    if (PEEK_DEAD) return { path: "dead-letters/peek", title: "Dead letters' messages" };
    return null;
  }

  // read again at most every 10 s: on a log middleware each peek opens a reader of its own
  const PEEK_EVERY = 10000;
  let peekedAt = 0;

  async function renderPeek() {
    const source = peekSource();
    if (!source || Date.now() - peekedAt < PEEK_EVERY) return;
    peekedAt = Date.now();
    const { status, body } = await api(`${source.path}?count=${PEEK_COUNT}`);
    $("peek").hidden = false;
    $("peek-title").textContent = source.title;
    const rows = $("peek-messages").querySelector("tbody");
    if (status !== 200 || !body) {
      $("peek-note").textContent = (body && body.error) || `HTTP ${status}`;
      $("peek-note").className = "error";
      rows.replaceChildren();
      return;
    }
    const items = body.messages || (body.dead_letters || []).map((d) => ({
      where: `dead letter (${d.reason})`, timestamp: d.time, topic: d.topic, message_id: d.message_id,
      headers: {}, payload: d.body ?? `(binary, ${number(d.size)} bytes)`,
    }));
    $("peek-count").textContent = `(${items.length})`;
    const note = body.complete === false
      ? `Only what the gateway holds in memory is shown: ${body.note}`
      : body.note || "Shown as they wait, oldest first, without consuming them.";
    $("peek-note").textContent = note;
    $("peek-note").className = body.complete === false ? "error" : "muted";
    rows.replaceChildren(...items.map((m, i) => el("tr", { "data-key": String(i), "data-where": m.where },
      el("td", { class: "num" }, String(i + 1)),
      el("td", {}, m.where),
      el("td", { title: m.stored_at ? `stored ${when(m.stored_at)}` : null }, when(m.timestamp)),
      el("td", { class: "wrap" }, el("code", {}, m.topic || "")),
      el("td", {}, m.message_id ? shortId(m.message_id) : ""),
      el("td", { class: "wrap" }, Object.entries(m.headers || {}).map(([k, v]) => `${k}=${v}`).join(", ")),
      el("td", { class: "payload" }, m.payload))));
    if (!items.length) rows.append(el("tr", {}, el("td", { colSpan: 7, class: "muted" }, "nothing waiting")));
  }

  // answers can come back out of order: only the latest query's answer is shown
  let subscriptionQueries = 0;
  async function querySubscriptions() {
    const asked = ++subscriptionQueries;
    const paging = query.q || query.sort || query.offset;
    $("sub-prev").disabled = query.offset === 0;
    if (!paging) {
      $("sub-page").textContent = "";
      $("sub-next").disabled = true;
      return;
    }
    const [sort, order] = (query.sort || "created").split(" ");
    const args = new URLSearchParams({ q: query.q, sort, order: order || "asc", offset: query.offset, limit: PAGE });
    const { status, body } = await api(`subscriptions?${args}`);
    if (asked !== subscriptionQueries || status !== 200 || !body) return;
    renderSubscriptions(body.subscriptions, body.count);
    const last = query.offset + body.subscriptions.length;
    $("sub-page").textContent = body.count ? `${query.offset + 1} to ${last} of ${number(body.count)}` : "no match";
    $("sub-next").disabled = last >= body.count;
  }

  function requery() {
    query.offset = 0;
    refresh();
  }

  function schedule() {
    clearInterval(timer);
    timer = null;
    if (REFRESH > 0 && $("live").checked) timer = setInterval(refresh, REFRESH);
  }

  // -- rendering -------------------------------------------------------------------------
  function bytes(value) {
    if (value === null || value === undefined) return "?";
    const units = ["B", "kB", "MB", "GB", "TB"];
    let v = value, i = 0;
    while (v >= 1000 && i < units.length - 1) { v /= 1000; i += 1; }
    return `${i ? v.toFixed(1) : v} ${units[i]}`;
  }

  function yesNo(id, value, yes = "yes", no = "no") {
    const node = $(id);
    node.textContent = value ? yes : no;
    node.className = `value ${value ? "yes" : "no"}`;
  }

  function render(data) {
    $("broker").textContent = data.broker || "";
    const h = data.health;
    $("health-adapter").textContent = `${h.adapter} (${h.shape})`;
    $("health-url").textContent = h.url;
    yesNo("health-available", h.available);
    $("health-answers").textContent = h.answers
      ? "the middleware answers"
      : `the middleware does not answer${h.reason ? `: ${h.reason}` : ""}`;
    yesNo("health-ready", h.ready);
    $("health-started").textContent = (h.started ? "resources restored" : "starting")
      + (h.store_reason ? `; the store does not answer: ${h.store_reason}` : "");
    $("health-disk").textContent = h.disk_low
      || (h.disk_free == null ? "not watched" : `${(h.disk_free / 1048576).toFixed(0)} MiB free`);
    const t = data.totals;
    $("total-subscriptions").textContent = number(t.subscriptions);
    $("total-states").textContent = `${number(t.paused)} paused, ${number(t.failing)} failing`;
    $("total-pull-points").textContent = number(t.pull_points);
    $("total-registrations").textContent = number(t.registrations);
    $("total-backlog").textContent = number(t.backlog) + (t.backlog_unknown ? "+" : "");
    $("total-messages").textContent = number(t.messages);
    $("total-rate").textContent = `${t.rate.toFixed(1)} msg/s now`;
    const n = data.node || {};
    $("node-memory").textContent = bytes(n.memory);
    $("node-pid").textContent = n.pid ? `process ${n.pid}` : "";
    $("node-open-files").textContent = number(n.open_files);
    $("node-threads").textContent = number(n.threads);
    $("node-python-threads").textContent = `${number(n.python_threads)} Python threads`;
    $("node-store").textContent = bytes(n.store_bytes);
    $("node-data").textContent = n.data_dir ? `data directory ${bytes(n.data_bytes)}` : "";
    if (!(query.q || query.sort || query.offset)) renderSubscriptions(data.subscriptions, t.subscriptions);
    renderPullPoints(data.pull_points, t.pull_points);
    renderTopics(data.topics, t.topics);
    renderRegistrations(data.registrations, t.registrations);
    if (data.cluster) renderCluster(data.cluster);
    renderUpstreams(data.upstreams || []);
  }

  // Rows are updated in place, keyed by data-key: a cell is replaced only when what it
  // shows changed, so buttons, hover and text selection survive a refresh.
  function patchRow(row, fresh) {
    for (const name of fresh.getAttributeNames()) row.setAttribute(name, fresh.getAttribute(name));
    const cells = Array.from(fresh.children);
    const old = Array.from(row.children);
    cells.forEach((cellNode, i) => {
      const before = old[i];
      if (!before) { row.append(cellNode); return; }
      const same = before.className.replace(" changed", "") === cellNode.className.replace(" changed", "")
        && before.title === cellNode.title
        && (cellNode.dataset.sig !== undefined
          ? before.dataset.sig === cellNode.dataset.sig
          : before.innerHTML === cellNode.innerHTML);
      if (!same) row.replaceChild(cellNode, before);
    });
    old.slice(cells.length).forEach((extra) => extra.remove());
  }

  function fill(name, rows, total) {
    const body = document.querySelector(`#${name} tbody`);
    const existing = new Map(Array.from(body.children).map((r) => [r.dataset.key, r]));
    const keep = new Set();
    rows.forEach((fresh, i) => {
      const key = fresh.dataset.key;
      const row = existing.get(key);
      let node = fresh;
      if (row) { patchRow(row, fresh); node = row; }
      keep.add(key);
      if (body.children[i] !== node) body.insertBefore(node, body.children[i] || null);
    });
    for (const [key, row] of existing) if (!keep.has(key)) row.remove();
    $(`empty-${name}`).hidden = rows.length > 0;
    $(`count-${name}`).textContent = rows.length < total ? `(${rows.length} of ${total})` : `(${total})`;
  }

  function button(label, onClick, danger = false) {
    const b = el("button", { type: "button", class: danger ? "danger" : "" }, label);
    b.addEventListener("click", () => onClick(b));
    return b;
  }

  function renderSubscriptions(items, total) {
    fill("subscriptions", items.map((s) => {
      const d = s.delivery;
      const failing = d && d.failures > 0;
      const state = failing ? "failing" : s.state;
      const key = (field) => `s/${s.id}/${field}`;
      const actions = el("td", { class: "actions", "data-sig": s.state },
        s.state === "paused"
          ? button("Resume", (b) => act(b, "subscriptions", s.id, "resume"))
          : button("Pause", (b) => act(b, "subscriptions", s.id, "pause")),
        button("Purge", (b) => act(b, "subscriptions", s.id, "purge", "Drop every message waiting for this subscription?"), true),
        button("Unsubscribe", (b) => act(b, "subscriptions", s.id, "unsubscribe", "End this subscription?"), true));
      const consumer = s.pull_point ? `pull point ${s.pull_point}` : s.consumer;
      return el("tr", { "data-key": s.id, "data-id": s.id, "data-state": s.state },
        el("td", {}, el("a", { href: `admin?subscription=${encodeURIComponent(s.id)}` }, shortId(s.id))),
        el("td", { class: "wrap" }, el("code", {}, consumer)),
        el("td", { class: "wrap" }, expression(s.topic)),
        el("td", { class: "state" }, el("span", { class: `badge ${state}` }, state)),
        cell(key("backlog"), "num backlog", number(s.backlog), s.backlog === null ? "the middleware cannot tell" : `${number(s.waiting)} waiting, ${number(d ? d.held : 0)} in memory`),
        cell(key("delivered"), "num delivered", d ? number(d.delivered) : "-", d && d.last_delivery ? `last ${when(d.last_delivery)}` : null),
        cell(key("failures"), "num failures", d ? number(d.failures) : "-"),
        el("td", { class: "retry", title: d ? when(d.retry_at) : null }, d ? retry(d.retry_at) : ""),
        el("td", { class: "error", title: d && d.last_error ? d.last_error : null }, el("div", {}, d && d.last_error ? d.last_error : "")),
        el("td", { class: "terminates", title: when(s.terminates) }, s.terminates ? relative(s.terminates) : "never"),
        actions);
    }), total);
  }

  function renderPullPoints(items, total) {
    fill("pull-points", items.map((p) => el("tr", { "data-key": p.id, "data-id": p.id },
      el("td", {}, el("a", { href: `admin?pull_point=${encodeURIComponent(p.id)}` }, shortId(p.id))),
      el("td", {}, p.name || ""),
      cell(`p/${p.id}/waiting`, "num waiting", number(p.waiting)),
      el("td", { class: "wrap" }, p.feeding.length ? `${p.feeding.length} subscription(s)` : "Notify only"),
      el("td", { title: when(p.created) }, relative(p.created)),
      el("td", { title: when(p.terminates) }, p.terminates ? relative(p.terminates) : "never"),
      el("td", { class: "actions", "data-sig": "purge" },
        button("Purge", (b) => act(b, "pullpoints", p.id, "purge", "Drop every message waiting in this pull point?"), true)))),
    total);
  }

  async function queryDeadLetters() {
    const { status, body } = await api("dead-letters");
    if (status === 200 && body) renderDeadLetters(body.dead_letters, body.count);
  }

  function renderDeadLetters(items, total) {
    fill("dead-letters", items.map((d) => el("tr", { "data-key": d.id, "data-id": d.id },
      el("td", { title: d.id }, shortId(d.id)),
      el("td", { title: d.time }, relative(d.time)),
      el("td", { class: "reason" }, d.reason),
      el("td", { class: "num" }, number(d.attempts)),
      el("td", { title: d.consumer }, shortId(d.subscription)),
      el("td", { class: "wrap" }, el("code", {}, d.topic || "")),
      el("td", { class: "error", title: d.last_error || null }, el("div", {}, d.last_error || "")),
      el("td", { class: "actions", "data-sig": "dead-letter" },
        button("Replay", (b) => act(b, "dead-letters", d.id, "replay")),
        button("Replay to…", (b) => {
          const to = window.prompt("Deliver to this consumer address:");
          if (to) act(b, "dead-letters", d.id, "replay", null, { consumer: to });
        }),
        button("Purge", (b) => act(b, "dead-letters", d.id, "purge", "Remove this dead letter for good?"), true)))),
    total);
  }

  function renderTopics(items, total) {
    fill("topics", items.map((t) => el("tr", { "data-key": t.topic, "data-topic": t.topic },
      el("td", { class: "wrap", title: t.namespace }, el("code", {}, t.path), el("span", { class: "dialect" }, t.namespace)),
      cell(`t/${t.topic}/messages`, "num messages", number(t.messages)),
      el("td", { class: "num rate" }, `${t.rate.toFixed(1)}/s`),
      el("td", { title: when(t.last) }, relative(t.last)))),
    total);
  }

  function renderRegistrations(items, total) {
    fill("registrations", items.map((r) => el("tr", { "data-key": r.id, "data-id": r.id },
      el("td", {}, shortId(r.id)),
      el("td", { class: "wrap" }, el("code", {}, r.publisher || "(anonymous)")),
      el("td", { class: "wrap" }, ...(r.topics.length ? r.topics.map((x) => el("div", {}, expression(x))) : ["(any)"])),
      el("td", {}, r.demand ? (r.demand_paused ? "paused (no demand)" : "active") : "no"),
      el("td", { title: when(r.terminates) }, r.terminates ? relative(r.terminates) : "never"))),
    total);
  }

  function seconds(value) {
    return value == null ? "-" : `${value.toFixed(1)} s`;
  }

  function renderCluster(c) {
    const k = c.counts;
    $("cluster-summary").textContent = (c.shared
      ? `This instance (${c.instance}) delivers ${c.held.length} of ${c.shards} shards`
      : `One instance on a SQLite store (${c.instance}): it delivers every shard`)
      + `${c.leader ? " and runs the periodic work" : ""}; ${number(k.renewals)} lease renewals, `
      + `${number(k.failovers)} failovers, ${number(k.heartbeat_failures)} failed heartbeats, `
      + `store round trip ${seconds(k.store_seconds)}`
      + `${k.follow_failing ? `; ${number(k.follow_failing)} changes of other instances failing to be followed` : ""}.`
      + `${c.error ? " " + c.error : ""}`;
    fill("instances", c.instances.map((i) => el("tr", { "data-key": i.id, "data-id": i.id },
      el("td", {}, el("code", {}, i.id), i.this ? " (this one)" : ""),
      el("td", { class: "wrap" }, i.address || "-"),
      el("td", {}, i.version || "-"),
      el("td", {}, `${seconds(i.heartbeat_age)} ago`),
      el("td", { class: "num", title: i.shards.join(",") }, number(c.shared ? i.shards.length : c.shards)),
      el("td", {}, seconds(i.lease_left)))),
    c.instances.length);
  }

  function renderUpstreams(items) {
    fill("upstreams", items.map((u) => el("tr", { "data-key": u.name },
      el("td", {}, u.name),
      el("td", { class: "wrap" }, el("code", {}, u.url)),
      el("td", { class: "wrap" }, u.topic || "(any)"),
      el("td", {}, `${u.state} (${u.mode})`),
      el("td", { class: "num" }, number(u.relayed)),
      el("td", { class: "num" }, number(u.subscribes)),
      el("td", { class: "wrap" }, u.error || ""))),
    items.length);
  }

  // -- actions ---------------------------------------------------------------------------
  async function act(btn, kind, id, action, question, form) {
    if (question && !window.confirm(question)) return;
    btn.disabled = true;
    try {
      const headers = { "Content-Type": "application/json" };
      if (session.csrf) headers["X-CSRF-Token"] = session.csrf;
      const { status, body } = await api(`${kind}/${encodeURIComponent(id)}/${action}`, { method: "POST", headers, body: JSON.stringify(form || {}) });
      if (status === 200) {
        const purged = action === "purge" ? ` (${body.purged === null ? "?" : body.purged} message(s) dropped)` : "";
        const to = action === "replay" ? ` to ${body.delivered_to}` : "";
        notice(`${action}: ${id}${purged}${to}`);
      } else {
        notice(`${action} refused: ${(body && body.error) || `HTTP ${status}`}`, true);
        if (status === 401 || status === 403) await loadSession();
      }
    } finally {
      btn.disabled = false;
      peekedAt = 0;
      await refresh();
    }
  }

  async function publish(event) {
    event.preventDefault();
    const headers = { "Content-Type": "application/json" };
    if (session.csrf) headers["X-CSRF-Token"] = session.csrf;
    const pairs = $("publish-headers").value.split("\n").map((line) => line.trim()).filter(Boolean)
      .map((line) => { const at = line.indexOf("="); return at < 0 ? [line, ""] : [line.slice(0, at).trim(), line.slice(at + 1)]; });
    const form = { topic: $("publish-topic").value.trim(), payload: $("publish-payload").value, content_type: $("publish-type").value || null, headers: Object.fromEntries(pairs) };
    const { status, body } = await api("notify", { method: "POST", headers, body: JSON.stringify(form) });
    if (status === 200) notice(`published on ${form.topic}`);
    else notice(`publish refused: ${(body && body.error) || `HTTP ${status}`}`, true);
    await refresh();
  }

  async function signIn(event) {
    event.preventDefault();
    const token = $("token");
    const user = $("user");
    const form = user.value ? { user: user.value, password: token.value } : { token: token.value };
    const { status, body } = await api("session", {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(form),
    });
    token.value = "";
    if (status === 200) notice("signed in: actions enabled");
    else notice(`sign-in refused: ${(body && body.error) || `HTTP ${status}`}`, true);
    await loadSession();
    await refresh();
  }

  async function signOut() {
    await api("session/end", { method: "POST" });
    notice("signed out");
    await loadSession();
    await refresh();
  }

  async function start() {
    $("sign-in").addEventListener("submit", signIn);
    $("sign-out").addEventListener("click", signOut);
    $("publish").addEventListener("submit", publish);
    let typing = null;
    $("sub-search").addEventListener("input", () => {
      clearTimeout(typing);
      typing = setTimeout(() => { query.q = $("sub-search").value.trim(); requery(); }, 250);
    });
    $("sub-query").addEventListener("submit", (event) => { event.preventDefault(); query.q = $("sub-search").value.trim(); requery(); });
    $("sub-sort").addEventListener("change", () => { query.sort = $("sub-sort").value; requery(); });
    $("sub-prev").addEventListener("click", () => { query.offset = Math.max(0, query.offset - PAGE); refresh(); });
    $("sub-next").addEventListener("click", () => { query.offset += PAGE; refresh(); });
    $("live").addEventListener("change", () => { schedule(); if ($("live").checked) refresh(); });
    if (REFRESH === 0) $("live").checked = false;
    await loadSession();
    await refresh();
    schedule();
  }

  document.addEventListener("DOMContentLoaded", start);
})();

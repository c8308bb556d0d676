"""The admin page with its values filled in on the server (:func:`prefilled`), so that it
shows them without JavaScript, in a screenshot taken before the first refresh, and to
tools that read HTML; the page's script then replaces them in place as it refreshes
(rows keep the ``data-key`` the script uses).  Texts match what the script renders."""

from __future__ import annotations

from typing import Any

from lxml import html


def _number(value: object) -> str:
    return "?" if value is None else f"{value:,}" if isinstance(value, int) else str(value)


def _bytes(value: int | None) -> str:
    """``12.3 MB``, as the script shows sizes."""
    if value is None:
        return "?"
    size, unit = float(value), 0
    units = ("B", "kB", "MB", "GB", "TB")
    while size >= 1000 and unit < len(units) - 1:
        size /= 1000
        unit += 1
    return f"{size:.1f} {units[unit]}" if unit else f"{value} B"


def _set(doc: Any, element_id: str, text: str, cls: str | None = None) -> None:
    node = doc.get_element_by_id(element_id, None)
    if node is None:
        return
    for child in list(node):
        node.remove(child)
    node.text = text
    if cls is not None:
        node.set("class", cls)


def _expression(expr: dict[str, Any] | None) -> str:
    """A topic expression with the namespaces of its prefixes: ``tns:a//*  (tns =
    urn:x)``, as the script shows it."""
    if not expr:
        return "(all topics)"
    used = [
        f"{p} = {u}" for p, u in (expr.get("namespaces") or {}).items() if f"{p}:" in expr["text"]
    ]
    return str(expr["text"]) + (f"  ({', '.join(used)})" if used else "")


def _short(identifier: str) -> str:
    return identifier if len(identifier) <= 12 else identifier[:10] + "…"


def _row(tbody: Any, key: str, cells: list[tuple[str, str]], **data: str) -> None:
    row = html.Element("tr")
    row.set("data-key", key)
    for name, value in data.items():
        row.set(f"data-{name.replace('_', '-')}", value)
    for cls, text in cells:
        cell = html.Element("td")
        if cls:
            cell.set("class", cls)
        cell.text = text
        row.append(cell)
    tbody.append(row)


def _tbody(doc: Any, table_id: str) -> Any:
    table = doc.get_element_by_id(table_id)
    return table.find("tbody")


def prefilled(page: bytes, data: dict[str, Any], role: str) -> bytes:
    """``page`` (the page's HTML) with the overview ``data`` and the caller's ``role``."""
    doc: Any = html.document_fromstring(page)
    doc.get_element_by_id("content").attrib.pop("hidden", None)
    _set(doc, "role", role, "badge admin" if role != "read-only" else "badge")
    _set(doc, "broker", data.get("broker") or "")
    _health(doc, data["health"])
    _totals(doc, data["totals"])
    _node(doc, data.get("node") or {})
    _subscription_rows(doc, data["subscriptions"])
    _pull_point_rows(doc, data["pull_points"])
    _topic_rows(doc, data["topics"])
    _registration_rows(doc, data["registrations"])
    t = data["totals"]
    for name, items, total in (
        ("subscriptions", data["subscriptions"], t["subscriptions"]),
        ("pull-points", data["pull_points"], t["pull_points"]),
        ("topics", data["topics"], t["topics"]),
        ("registrations", data["registrations"], t["registrations"]),
    ):
        shown = len(items)
        _set(doc, f"count-{name}", f"({shown} of {total})" if shown < total else f"({total})")
        _show_empty(doc, name, shown)
    ups = data.get("upstreams") or []
    _upstream_rows(doc, ups)
    _set(doc, "count-upstreams", f"({len(ups)})")
    _show_empty(doc, "upstreams", len(ups))
    if "detail_id" in data:
        _detail(doc, str(data["detail_id"]), data.get("detail"))
    if "peek" in data:
        _peek(doc, data["peek"])
    return bytes(html.tostring(doc, doctype="<!doctype html>", encoding="utf-8"))


def _show_empty(doc: Any, name: str, shown: int) -> None:
    """The "none yet" line of table ``name``: hidden when the table shows rows."""
    empty = doc.get_element_by_id(f"empty-{name}", None)
    if empty is not None and shown:
        empty.set("hidden", "")
    elif empty is not None:
        empty.attrib.pop("hidden", None)


def _health(doc: Any, h: dict[str, Any]) -> None:
    _set(doc, "health-adapter", f"{h['adapter']} ({h['shape']})")
    _set(doc, "health-url", h["url"] or "")
    for key, name in (("available", "health-available"), ("ready", "health-ready")):
        _set(doc, name, "yes" if h[key] else "no", f"value {'yes' if h[key] else 'no'}")
    answers = "the middleware answers" if h["answers"] else "the middleware does not answer"
    _set(doc, "health-answers", answers)
    _set(doc, "health-started", "resources restored" if h["started"] else "starting")


def _totals(doc: Any, t: dict[str, Any]) -> None:
    _set(doc, "total-subscriptions", _number(t["subscriptions"]))
    _set(doc, "total-states", f"{_number(t['paused'])} paused, {_number(t['failing'])} failing")
    _set(doc, "total-pull-points", _number(t["pull_points"]))
    _set(doc, "total-registrations", _number(t["registrations"]))
    _set(doc, "total-backlog", _number(t["backlog"]) + ("+" if t["backlog_unknown"] else ""))
    _set(doc, "total-messages", _number(t["messages"]))
    _set(doc, "total-rate", f"{t['rate']:.1f} msg/s now")
    _set(doc, "last-refresh", "values as the page was served")


def _node(doc: Any, n: dict[str, Any]) -> None:
    _set(doc, "node-memory", _bytes(n.get("memory")))
    _set(doc, "node-pid", f"process {n['pid']}" if n.get("pid") else "")
    _set(doc, "node-open-files", _number(n.get("open_files")))
    _set(doc, "node-threads", _number(n.get("threads")))
    _set(doc, "node-python-threads", f"{_number(n.get('python_threads'))} Python threads")
    _set(doc, "node-store", _bytes(n.get("store_bytes")))
    data_dir = n.get("data_dir")
    _set(doc, "node-data", f"data directory {_bytes(n.get('data_bytes'))}" if data_dir else "")


def _subscription_rows(doc: Any, subscriptions: list[dict[str, Any]]) -> None:
    subs = _tbody(doc, "subscriptions")
    for s in subscriptions:
        d = s.get("delivery") or {}
        state = "failing" if d.get("failures") else s["state"]
        consumer = f"pull point {s['pull_point']}" if s.get("pull_point") else s["consumer"]
        _row(
            subs,
            s["id"],
            [
                ("", _short(s["id"])),
                ("wrap", consumer),
                ("wrap", _expression(s.get("topic"))),
                ("state", state),
                ("num backlog", _number(s.get("backlog"))),
                ("num delivered", _number(d.get("delivered")) if d else "-"),
                ("num failures", _number(d.get("failures")) if d else "-"),
                ("retry", d.get("retry_at") or "" if d else ""),
                ("error", d.get("last_error") or "" if d else ""),
                ("terminates", s.get("terminates") or "never"),
                ("actions", ""),
            ],
            id=s["id"],
            state=s["state"],
        )


def _pull_point_rows(doc: Any, pull_points: list[dict[str, Any]]) -> None:
    pps = _tbody(doc, "pull-points")
    for p in pull_points:
        feeding = f"{len(p['feeding'])} subscription(s)" if p["feeding"] else "Notify only"
        _row(
            pps,
            p["id"],
            [
                ("", _short(p["id"])),
                ("", p.get("name") or ""),
                ("num waiting", _number(p.get("waiting"))),
                ("wrap", feeding),
                ("", p.get("created") or ""),
                ("", p.get("terminates") or "never"),
                ("actions", ""),
            ],
            id=p["id"],
        )


def _topic_rows(doc: Any, topics: list[dict[str, Any]]) -> None:
    body = _tbody(doc, "topics")
    for tp in topics:
        _row(
            body,
            tp["topic"],
            [
                ("wrap", f"{tp['path']}  {tp['namespace']}"),
                ("num messages", _number(tp["messages"])),
                ("num rate", f"{tp['rate']:.1f}/s"),
                ("", tp.get("last") or ""),
            ],
            topic=tp["topic"],
        )


def _registration_rows(doc: Any, registrations: list[dict[str, Any]]) -> None:
    regs = _tbody(doc, "registrations")
    for r in registrations:
        demand = "no"
        if r["demand"]:
            demand = "paused (no demand)" if r.get("demand_paused") else "active"
        _row(
            regs,
            r["id"],
            [
                ("", _short(r["id"])),
                ("wrap", r.get("publisher") or "(anonymous)"),
                ("wrap", " ".join(_expression(x) for x in r["topics"]) or "(any)"),
                ("", demand),
                ("", r.get("terminates") or "never"),
            ],
            id=r["id"],
        )


def _upstream_rows(doc: Any, upstreams: list[dict[str, Any]]) -> None:
    body = _tbody(doc, "upstreams")
    for u in upstreams:
        _row(
            body,
            u["name"],
            [
                ("", u["name"]),
                ("wrap", u["url"]),
                ("wrap", u["topic"] or "(any)"),
                ("", f"{u['state']} ({u['mode']})"),
                ("num", _number(u["relayed"])),
                ("num", _number(u["subscribes"])),
                ("wrap", u["error"] or ""),
            ],
        )


def _field(tbody: Any, name: str, value: str) -> None:
    row = html.Element("tr")
    row.set("data-field", name)
    head = html.Element("th")
    head.text = name
    cell = html.Element("td")
    cell.set("class", "wrap")
    cell.text = value
    row.extend((head, cell))
    tbody.append(row)


def _detail(doc: Any, subscription_id: str, d: dict[str, Any] | None) -> None:
    """One subscription's page (``/admin?subscription=ID``): its fields and its last
    delivery attempts, as the script renders them."""
    section = doc.get_element_by_id("detail")
    section.attrib.pop("hidden", None)
    _set(doc, "detail-id", subscription_id)
    fields = doc.get_element_by_id("detail-fields")
    if d is None:
        _field(fields, "error", f"no subscription {subscription_id!r}")
        return
    delivery = d.get("delivery") or {}
    failing = bool(delivery.get("failures"))
    consumer = f"pull point {d['pull_point']}" if d.get("pull_point") else d.get("consumer") or ""
    kind = "raw (UseRaw)" if d.get("use_raw") else "wrapped Notify"
    held = _number(delivery.get("held") or 0)
    backlog = f"{_number(d['backlog'])} ({_number(d['waiting'])} waiting in the middleware, "
    for name, value in (
        ("address", d["address"]),
        ("consumer", consumer),
        ("topic", _expression(d.get("topic"))),
        (
            "message content",
            _expression(d["message_content"]) if d.get("message_content") else "(none)",
        ),
        ("policy", f"{kind}, SOAP {d.get('soap_version')}, {d.get('mode')}"),
        ("delivery policy", (d.get("delivery_policy") or {}).get("summary") or "-"),
        ("state", "failing" if failing else str(d.get("state"))),
        ("backlog", backlog + f"{held} in memory)"),
        (
            "delivered",
            _number(delivery.get("delivered"))
            if d.get("delivery")
            else "routed into its pull point",
        ),
        ("failures", _number(delivery.get("failures")) if d.get("delivery") else "-"),
        ("last error", delivery.get("last_error") or "-"),
        ("created", d.get("created") or ""),
        ("ends", d.get("terminates") or "never"),
    ):
        _field(fields, name, value)
    attempts = _tbody(doc, "detail-attempts")
    for a in d.get("attempts") or []:
        outcome = "delivered" if a["ok"] else "deferred" if a["deferred"] else "failed"
        _row(
            attempts,
            a["at"] or "",
            [
                ("", a["at"] or ""),
                ("", outcome),
                ("num", _number(a["messages"])),
                ("wrap", a["error"] or ""),
            ],
        )
    letters = _tbody(doc, "detail-dead-letters")
    for dl in d.get("dead_letters") or []:
        _row(
            letters,
            dl["id"],
            [
                ("", dl["time"] or ""),
                ("", dl["reason"]),
                ("num", _number(dl["attempts"])),
                ("wrap", dl["topic"] or ""),
                ("wrap", dl["last_error"] or ""),
                ("", dl["id"]),
            ],
            id=dl["id"],
        )


def _peek(doc: Any, peek: dict[str, Any]) -> None:
    """The first waiting messages (``?subscription=``, ``?pull_point=`` or
    ``?peek=dead-letters``), as the script renders them."""
    doc.get_element_by_id("peek").attrib.pop("hidden", None)
    _set(doc, "peek-title", str(peek["title"]))
    if peek.get("error"):
        _set(doc, "peek-note", str(peek["error"]), "error")
        return
    items = peek.get("messages")
    if items is None:
        items = [
            {
                "where": f"dead letter ({d['reason']})",
                "timestamp": d["time"],
                "topic": d["topic"],
                "message_id": d["message_id"],
                "headers": {},
                "payload": d["body"],
            }
            for d in peek.get("dead_letters") or []
        ]
    _set(doc, "peek-count", f"({len(items)})")
    if peek.get("complete") is False:
        _set(
            doc,
            "peek-note",
            f"Only what the gateway holds in memory is shown: {peek.get('note')}",
            "error",
        )
    elif peek.get("note"):
        _set(doc, "peek-note", str(peek["note"]))
    rows = _tbody(doc, "peek-messages")
    for i, m in enumerate(items):
        headers = ", ".join(f"{k}={v}" for k, v in (m.get("headers") or {}).items())
        _row(
            rows,
            str(i),
            [
                ("num", str(i + 1)),
                ("", str(m["where"])),
                ("", m.get("timestamp") or ""),
                ("wrap", m.get("topic") or ""),
                ("", _short(m["message_id"]) if m.get("message_id") else ""),
                ("wrap", headers),
                ("payload", str(m.get("payload") or "")),
            ],
            where=str(m["where"]),
        )

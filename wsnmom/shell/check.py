"""``wsnmom check URL``: what the WS-N broker at URL supports.

It reads the broker's WSDL (``URL?wsdl``: port types, operations, SOAP versions), asks its
resource properties for the topic expression dialects, whether the topic set is fixed and
whether publishers must register, and reads wsnmom's policy document (``/wsn/policy``) when
the broker has one.  The exit status is 0 for a WS-N broker (its WSDL offers Subscribe and
Notify with WS-BaseNotification messages, or it answers the WS-N resource properties) and 1
otherwise, including when nothing answers at URL.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin, urlsplit, urlunsplit

import click
from lxml import etree

from wsnmom.core.addresses import BROKER_PATH
from wsnmom.soap_frontend.xml import WSNBR, WSNMOM_POLICY, WSNT, XmlRejected, parse_xml, text_of
from wsnmom.topic_mapping.dialects import DIALECT_ALIASES

from .common import DIALECTS, credential_options, credentials, tls_options

if TYPE_CHECKING:
    import requests

_LABELS = {
    "simple": "Simple",
    "concrete": "Concrete",
    "full": "Full",
    "xpath": "XPath 1.0",
    "concreteset": "ONVIF ConcreteSet",
}

WSDL = "http://schemas.xmlsoap.org/wsdl/"
WSDL_SOAP11 = "http://schemas.xmlsoap.org/wsdl/soap/"
WSDL_SOAP12 = "http://schemas.xmlsoap.org/wsdl/soap12/"
_NAMES = {uri: _LABELS[name] for name, uri in DIALECTS.items()}
#: policy values longer than this are shown with --verbose only
_SHORT = 40


@dataclass
class Report:
    """What ``check`` found."""

    broker: str
    reachable: bool = False
    wsdl: str | None = None
    wsdl_error: str | None = None
    port_types: dict[str, list[str]] = field(default_factory=dict)
    soap_versions: list[str] = field(default_factory=list)
    dialects: list[str] = field(default_factory=list)
    properties_error: str | None = None
    fixed_topic_set: bool | None = None
    requires_registration: bool | None = None
    policy: dict[str, str] = field(default_factory=dict)

    @property
    def wsdl_is_wsn(self) -> bool:
        ops = {op for ops in self.port_types.values() for op in ops}
        return {"Subscribe", "Notify"} <= ops

    @property
    def is_broker(self) -> bool:
        return self.wsdl_is_wsn or bool(self.dialects)


def broker_url(url: str) -> str:
    """The endpoint to check: ``URL`` without its query; a bare base URL means the gateway's
    ``/wsn/broker``."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - a port that is no number raises ValueError
    except ValueError as exc:
        message = f"{url!r} is not an http(s) URL ({exc})"
        raise click.BadParameter(message, param_hint="URL") from None
    if not parts.scheme or not parts.netloc:
        raise click.BadParameter(f"{url!r} is not an http(s) URL", param_hint="URL")
    path = parts.path if parts.path not in ("", "/") else BROKER_PATH
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def _read_wsdl(report: Report, http: requests.Session, timeout: float) -> None:
    import requests

    url = report.broker + "?wsdl"
    pending, seen = [url], set[str]()
    while pending and len(seen) < 6:
        location = pending.pop()
        seen.add(location)
        try:
            resp = http.get(location, timeout=timeout, **tls_options())
        except requests.RequestException as exc:
            report.wsdl_error = f"cannot reach {location}: {exc}"
            return
        report.reachable = True
        try:
            doc = parse_xml(resp.content)
        except XmlRejected as exc:
            report.wsdl_error = f"{location} (HTTP {resp.status_code}) is not XML: {exc}"
            return
        if doc.tag != f"{{{WSDL}}}definitions":
            report.wsdl_error = f"{location} is not a WSDL 1.1 document ({etree.QName(doc)})"
            return
        report.wsdl = url
        _read_definitions(report, doc)
        for imp in doc.findall(f"{{{WSDL}}}import"):
            target = urljoin(location, imp.get("location") or "")
            if target not in seen and target != location:
                pending.append(target)


def _read_definitions(report: Report, doc: etree._Element) -> None:
    messages: dict[str, str] = {}
    for msg in doc.findall(f"{{{WSDL}}}message"):
        part = msg.find(f"{{{WSDL}}}part")
        if part is not None:
            messages[msg.get("name", "")] = part.get("element", "")
    for pt in doc.findall(f"{{{WSDL}}}portType"):
        ops = report.port_types.setdefault(pt.get("name", "?"), [])
        for op in pt.findall(f"{{{WSDL}}}operation"):
            name = op.get("name", "")
            inp = op.find(f"{{{WSDL}}}input")
            message = (inp.get("message") or "").split(":")[-1] if inp is not None else ""
            element = messages.get(message, "")
            prefix = element.split(":")[0] if ":" in element else None
            ns = op.nsmap.get(prefix) if prefix else None
            if name in ("Subscribe", "Notify") and ns not in (WSNT, None):
                continue  # an operation of that name with other messages is not WS-N's
            if name not in ops:
                ops.append(name)
    for binding_ns, version in ((WSDL_SOAP11, "1.1"), (WSDL_SOAP12, "1.2")):
        bound = doc.find(f"{{{WSDL}}}binding/{{{binding_ns}}}binding") is not None
        if bound and version not in report.soap_versions:
            report.soap_versions.append(version)


def _read_properties(report: Report, timeout: float) -> None:
    from wsnmom.client import ClientError, TransportError, WsnClient

    with WsnClient(
        report.broker, timeout=timeout, credentials=credentials(), **tls_options()
    ) as client:
        try:
            report.dialects = client.topic_expression_dialects()
        except ClientError as exc:
            report.properties_error = str(exc)
            if isinstance(exc, TransportError) and exc.status is None:
                return
        else:
            report.reachable = True
        for name, attr in (
            (f"{{{WSNT}}}FixedTopicSet", "fixed_topic_set"),
            (f"{{{WSNBR}}}RequiresRegistration", "requires_registration"),
        ):
            try:
                values = client.get_resource_property(name)
            except ClientError:
                continue
            if values:
                setattr(report, attr, text_of(values[0]).lower() in ("true", "1"))


def _read_policy(report: Report, http: requests.Session, timeout: float) -> None:
    import requests

    parts = urlsplit(report.broker)
    path = parts.path[: -len(BROKER_PATH)] if parts.path.endswith(BROKER_PATH) else ""
    url = urlunsplit((parts.scheme, parts.netloc, path + "/wsn/policy", "", ""))
    try:
        resp = http.get(url, timeout=timeout, **tls_options())
        doc = parse_xml(resp.content) if resp.status_code == 200 else None
    except (requests.RequestException, XmlRejected):
        return
    if doc is None or doc.tag != f"{{{WSNMOM_POLICY}}}BrokerPolicy":
        return
    for el in doc.iter():
        if el is doc or not isinstance(el.tag, str) or len(el):
            continue
        names = [etree.QName(a).localname for a in el.iterancestors() if a is not doc][::-1]
        key = ".".join([*names, etree.QName(el).localname])
        value = text_of(el)
        report.policy[key] = f"{report.policy[key]}, {value}" if key in report.policy else value


def _dialect_label(uri: str) -> str:
    if uri in _NAMES:
        return f"{_NAMES[uri]} ({uri})"
    if uri in DIALECT_ALIASES:
        return f"{_NAMES.get(DIALECT_ALIASES[uri], '?')}, older URI ({uri})"
    return uri


def _print(report: Report, verbose: bool) -> None:
    click.echo(f"broker:       {report.broker}")
    if report.wsdl:
        versions = " and ".join(f"SOAP {v}" for v in report.soap_versions) or "no SOAP binding"
        click.echo(f"WSDL:         {report.wsdl} ({versions})")
        for pt, ops in report.port_types.items():
            click.echo(f"  {pt}: {', '.join(ops)}")
    else:
        click.echo(f"WSDL:         none ({report.wsdl_error})")
    if report.dialects:
        click.echo("dialects:")
        for uri in report.dialects:
            click.echo(f"  {_dialect_label(uri)}")
    elif report.reachable:
        click.echo(f"dialects:     not answered ({report.properties_error})")
    for label, value in (
        ("topic set:    ", report.fixed_topic_set),
        ("registration: ", report.requires_registration),
    ):
        if value is not None:
            if "topic" in label:
                word = "fixed" if value else "open"
            else:
                word = "required" if value else "not required"
            click.echo(f"{label}{word}")
    if report.policy:
        shown = {k: v for k, v in report.policy.items() if verbose or len(v) <= _SHORT}
        hidden = len(report.policy) - len(shown)
        more = f"; {hidden} longer ones with --verbose" if hidden else ""
        click.echo(f"policy ({len(report.policy)} assertions{more}):")
        for key, text in shown.items():
            click.echo(f"  {key}: {text}")
    verdict = (
        "a WS-Notification broker"
        if report.is_broker
        else ("nothing answers" if not report.reachable else "not a WS-Notification broker")
    )
    click.echo(f"verdict:      {verdict}")


@click.command("check")
@click.argument("url")
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
@click.option("-v", "--verbose", is_flag=True, help="Show every policy assertion in full.")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=10.0, show_default=True)
@credential_options
def check_command(url: str, as_json: bool, verbose: bool, timeout: float) -> None:
    """Show what the WS-N broker at URL supports (WSDL, dialects, policy); exit 1 when URL
    is not a WS-N broker."""
    import requests

    report = Report(broker_url(url))
    with requests.Session() as http:
        _read_wsdl(report, http, timeout)
        if report.reachable:
            _read_properties(report, timeout)
            _read_policy(report, http, timeout)
    if as_json:
        data: dict[str, Any] = asdict(report)
        data["is_broker"] = report.is_broker
        click.echo(json.dumps(data, indent=2))
    else:
        _print(report, verbose)
    if not report.is_broker:
        raise SystemExit(1)

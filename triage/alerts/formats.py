"""What an alert says, and the request each platform takes for it: pure functions, no I/O.

A `Message` holds, in the order the issue asks for: level and category, node and GPU, the title,
the first lines of the traceback and the kernel lines that decided the label, the hint, and a link.
Each builder turns one into a `Request` (always POST, JSON body) inside the platform's documented
limits, by truncating with a visible "…", never by failing.

Shapes and limits relied on (looked up for this module):

- Slack incoming webhook: JSON with `text` (the notification fallback) and `blocks`; Block Kit
  limits: header text 150 chars, section text 3000 chars, context elements 10, 50 blocks a message
  (https://api.slack.com/reference/block-kit/blocks#section, .../header).
- Mattermost incoming webhook: Slack-compatible `text` and `attachments` (fallback, color, title,
  title_link, text); a post's message holds at most 16383 characters.
- Discord execute webhook: `content` <= 2000 chars, `embeds` <= 10; embed title 256, description
  4096, <= 25 fields (name 256, value 1024), footer text 2048, all of an embed's text <= 6000
  (https://discord.com/developers/docs/resources/message#embed-object-embed-limits).
- Teams Workflows webhook: `{"type": "message", "attachments": [{"contentType":
  "application/vnd.microsoft.card.adaptive", "content": <AdaptiveCard 1.4>}]}`; a message is at most
  28 KB, so the card is kept well under it.
- Feishu/Lark custom bot: `msg_type` "interactive" with `card`; with signature verification the body
  carries `timestamp` (seconds, as a string) and `sign` = base64(HMAC-SHA256(key = timestamp + "\\n" +
  secret, message = empty)); request body at most 20 KB
  (https://open.feishu.cn/document/client-docs/bot-v3/add-custom-bot).
- DingTalk custom robot: `msgtype` "markdown" with `markdown.title` and `markdown.text`; with
  signing, `timestamp` (ms) and `sign` = urlencode(base64(HMAC-SHA256(key = secret, message =
  timestamp + "\\n" + secret))) go in the query string
  (https://open.dingtalk.com/document/robots/customize-robot-security-settings).
- WeCom group robot: `msgtype` "markdown", `markdown.content` at most 4096 bytes of UTF-8
  (https://developer.work.weixin.qq.com/document/path/91770).
- Alertmanager `POST /api/v2/alerts`: a list of postableAlert: `labels` (alertname required),
  `annotations`, `startsAt`, `endsAt` (RFC 3339), `generatorURL`; clients re-send firing alerts
  (https://prometheus.io/docs/alerting/latest/clients/).
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import json
import re
import urllib.parse
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Kind = Literal["new", "update", "resolved", "test", "digest"]
KINDS: tuple[str, ...] = ("new", "update", "resolved", "test", "digest")

ELLIPSIS = "…"
#: Lines of the traceback and of the kernel log an alert quotes, each clipped to LINE_CHARS.
TRACE_LINES = 8
KERNEL_LINES = 4
EVIDENCE_LINES = 4
LINE_CHARS = 400
TITLE_CHARS = 200
HINT_CHARS = 2000
#: Incidents a digest names one by one (the rest are only counted).
DIGEST_TOP = 5
#: A firing Alertmanager alert ends this long after it was posted unless re-posted (the worker re-posts each minute).
ALERTMANAGER_HOLD_S = 300.0
ALERTNAME = "GPUTriageIncident"

_LEVEL_RANK = {"driver": 0, "code": 1}
_COLOR = {"driver": 0xD62728, "code": 0xFF9F1C, "resolved": 0x2CA02C, "test": 0x1F77B4, "digest": 0x7F7F7F}


# -- text helpers ------------------------------------------------------------------


def clip(text: str, limit: int) -> str:
    """`text` in at most `limit` characters; when cut, the last one is "…"."""
    if limit <= 0:
        return ""
    if len(text) <= limit:
        return text
    return text[: limit - 1] + ELLIPSIS


def clip_bytes(text: str, limit: int) -> str:
    """`text` in at most `limit` bytes of UTF-8, cut on a character boundary, ending in "…" when cut."""
    raw = text.encode()
    if len(raw) <= limit:
        return text
    room = limit - len(ELLIPSIS.encode())
    if room <= 0:
        return ""
    return raw[:room].decode("utf-8", errors="ignore") + ELLIPSIS


def _json_size(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False).encode())


def _iso(value: float) -> str:
    return dt.datetime.fromtimestamp(value, dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# -- the message -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Message:
    """What one alert says, whatever the platform: see the module's docstring for the order."""

    kind: str
    level: str
    category: str
    node: str
    devices: tuple[str, ...]
    title: str
    traceback: tuple[str, ...]
    kernel_lines: tuple[str, ...]
    hint: str
    link: str
    incident_id: str = ""
    fingerprint: str = ""
    summary: str = ""
    evidence: tuple[str, ...] = ()
    count: int = 1
    first_seen: str | None = None
    last_seen: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    #: The incident's JSON as the API returns it (what the generic sink posts); None for a digest.
    document: Mapping[str, Any] | None = None
    #: A digest: incidents per "level/category", the most important few, and how many in all.
    counts: Mapping[str, int] = field(default_factory=dict)
    items: tuple[Message, ...] = ()
    total: int = 1

    @property
    def headline(self) -> str:
        """One line: what kind of alert, level and category, node (and the title for one incident)."""
        if self.kind == "digest":
            return f"[DIGEST] {self.total} incident(s) on {self.node}"
        prefix = {"new": "", "update": "[UPDATE] ", "resolved": "[RESOLVED] ", "test": "[TEST] "}.get(self.kind, "")
        return f"{prefix}{self.level.upper()} {self.category} on {self.node}: {self.title}"

    @property
    def where(self) -> str:
        gpus = ", ".join(self.devices) if self.devices else "no GPU named"
        return f"node {self.node}, GPU {gpus}"


def _kernel_lines(document: Mapping[str, Any]) -> list[str]:
    """The kernel lines that decided the label: those of events in the incident's category, else all."""
    events = list(document.get("kernel_events") or [])
    deciding = [e for e in events if e.get("category") == document.get("category")] or events
    lines: list[str] = []
    for event in deciding:
        lines.extend(str(line) for line in event.get("lines") or [])
    return lines


def _traceback(document: Mapping[str, Any]) -> list[str]:
    """The first program failure's lines: its first ones and, when longer, its last ones (the exception)."""
    failures = list(document.get("program_failures") or [])
    if not failures:
        return []
    lines = [str(line) for line in failures[0].get("lines") or []]
    if len(lines) <= TRACE_LINES:
        return lines
    head = TRACE_LINES // 2
    tail = TRACE_LINES - head - 1
    return [*lines[:head], f"... {len(lines) - head - tail} lines ...", *lines[-tail:]]


def message_for(
    document: Mapping[str, Any],
    *,
    node: str,
    base_url: str,
    kind: str = "new",
    labels: Mapping[str, str] | None = None,
) -> Message:
    """The message for one incident document (render.incident_to_dict, or the API's)."""
    if kind not in KINDS or kind == "digest":
        raise ValueError(f"kind must be one of new, update, resolved, test: {kind!r}")
    incident_id = str(document.get("id", ""))
    evidence = [str(e) for e in document.get("evidence") or []]
    return Message(
        kind=kind,
        level=str(document.get("level", "")),
        category=str(document.get("category", "")),
        node=node,
        devices=tuple(str(d) for d in document.get("devices") or []),
        title=clip(str(document.get("title", "")), TITLE_CHARS),
        traceback=tuple(clip(line, LINE_CHARS) for line in _traceback(document)[:TRACE_LINES]),
        kernel_lines=tuple(clip(line, LINE_CHARS) for line in _kernel_lines(document)[:KERNEL_LINES]),
        hint=clip(str(document.get("hint", "")), HINT_CHARS),
        link=f"{base_url.rstrip('/')}/incidents/{incident_id}",
        incident_id=incident_id,
        fingerprint=str(document.get("fingerprint", "")),
        summary=clip(evidence[0], LINE_CHARS) if evidence else "",
        evidence=tuple(clip(e, LINE_CHARS) for e in evidence[:EVIDENCE_LINES]),
        count=int(document.get("count") or 1),
        first_seen=document.get("first_seen"),
        last_seen=document.get("last_seen"),
        labels=dict(labels or {}),
        document=document,
    )


def digest_for(
    documents: Sequence[Mapping[str, Any]],
    *,
    node: str,
    base_url: str,
    labels: Mapping[str, str] | None = None,
    top: int = DIGEST_TOP,
) -> Message:
    """One message for a burst: a count per level/category and the most important `top` incidents."""
    ordered = sorted(
        documents,
        key=lambda d: (_LEVEL_RANK.get(str(d.get("level")), 9), -int(d.get("count") or 1), str(d.get("id"))),
    )
    items = tuple(message_for(d, node=node, base_url=base_url, labels=labels) for d in ordered[:top])
    counts = Counter(f"{d.get('level')}/{d.get('category')}" for d in documents)
    first = items[0] if items else None
    return Message(
        kind="digest",
        level=first.level if first else "",
        category=first.category if first else "",
        node=node,
        devices=tuple(sorted({dev for d in documents for dev in d.get("devices") or []})),
        title=f"{len(documents)} incident(s)",
        traceback=(),
        kernel_lines=(),
        hint="",
        link=f"{base_url.rstrip('/')}/incidents",
        labels=dict(labels or {}),
        counts=dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))),
        items=items,
        total=len(documents),
    )


# -- markdown bodies shared by the chat platforms ------------------------------------


def _code(lines: Sequence[str]) -> str:
    body = "\n".join(line.replace("```", "'''") for line in lines)
    return f"```\n{body}\n```"


def _sections(message: Message) -> list[tuple[str, str]]:
    """(heading, markdown) parts of one incident, in the issue's order; digests list counts and top items."""
    if message.kind == "digest":
        counts = "\n".join(f"- {key}: {n}" for key, n in message.counts.items())
        parts = [("Incidents", counts)]
        for item in message.items:
            parts.append((f"{item.level.upper()} {item.category}", f"{item.title}\n{item.where}\n{item.link}"))
        if message.total > len(message.items):
            parts.append(("", f"and {message.total - len(message.items)} more: {message.link}"))
        return parts
    parts = [("Where", message.where), ("What", message.title)]
    if message.traceback:
        parts.append(("Traceback", _code(message.traceback)))
    if message.kernel_lines:
        parts.append(("Kernel", _code(message.kernel_lines)))
    if message.hint:
        parts.append(("Hint", message.hint))
    parts.append(("Link", message.link))
    return parts


def _clip_part(text: str, limit: int) -> str:
    """Clip markdown, closing a code fence the cut left open."""
    if len(text) <= limit:
        return text
    cut = clip(text, limit - 4)
    return cut + "\n```" if cut.count("```") % 2 else cut


def markdown(message: Message, *, bold: str = "**", limit: int, part_limit: int = 3000, in_bytes: bool = False) -> str:
    """The whole message as markdown, each part at most `part_limit` chars, all at most `limit` chars (or bytes).

    The link comes last and always survives: the parts before it are cut to make room.
    """
    lines = [f"{bold}{message.headline}{bold}"]
    tail = ""
    for heading, text in _sections(message):
        body = _clip_part(text, part_limit)
        if heading == "Link":
            tail = f"\n\n{bold}{heading}{bold}\n{body}"
            continue
        lines.append(f"{bold}{heading}{bold}\n{body}" if heading else body)
    text = "\n\n".join(lines)
    if not in_bytes:
        return _clip_part(text, limit - len(tail)) + tail
    room = limit - len(tail.encode())
    cut = clip_bytes(text, room)
    if cut.count("```") % 2:
        cut = clip_bytes(text, room - 4) + "\n```"
    return cut + tail


# -- requests ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Request:
    """What to POST: the URL (with any signature in its query), the JSON body, extra headers."""

    url: str
    json: Any
    headers: Mapping[str, str] = field(default_factory=lambda: {"Content-Type": "application/json"})
    method: str = "POST"


Builder = Callable[..., Request]


def slack(message: Message, *, url: str, secret: str | None = None, now: float = 0.0) -> Request:
    """Slack incoming webhook: `text` fallback plus header/section/context blocks (limits: module docstring)."""
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": clip(message.headline, 150), "emoji": False}}
    ]
    for heading, text in _sections(message):
        if heading == "Link":
            continue
        body = f"*{heading}*\n{text}" if heading else text
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": _clip_part(body, 3000)}})
    blocks = blocks[:49]
    blocks.append(
        {"type": "context", "elements": [{"type": "mrkdwn", "text": clip(f"<{message.link}|open incident>", 3000)}]}
    )
    return Request(url, {"text": clip(message.headline, 3000), "blocks": blocks})


def mattermost(message: Message, *, url: str, secret: str | None = None, now: float = 0.0) -> Request:
    """Mattermost incoming webhook: Slack-compatible `text` and one attachment, 16383 chars in all."""
    text = clip(message.headline, 1000)
    color = _COLOR.get(message.kind, _COLOR.get(message.level, 0x7F7F7F))
    body = markdown(message, limit=16383 - len(text))
    attachment = {
        "fallback": text,
        "color": f"#{color:06x}",
        "title": clip(message.title, 1000),
        "title_link": message.link,
        "text": body,
    }
    return Request(url, {"text": text, "attachments": [attachment]})


def discord(message: Message, *, url: str, secret: str | None = None, now: float = 0.0) -> Request:
    """Discord webhook: `content` <= 2000 and one embed inside Discord's per-field and 6000-char limits."""
    fields: list[dict[str, Any]] = []
    description = ""
    for heading, text in _sections(message):
        if heading in ("What", "Link"):
            continue
        if heading in ("Traceback", "Kernel", "Hint") or not heading:
            description += (f"**{heading}**\n" if heading else "") + text + "\n\n"
        else:
            fields.append({"name": clip(heading or "-", 256), "value": _clip_part(text, 1024), "inline": False})
    fields = fields[:25]
    footer = clip(f"gpu-triage · {message.fingerprint or message.kind}", 2048)
    title = clip(message.headline, 256)
    used = len(title) + len(footer) + sum(len(f["name"]) + len(f["value"]) for f in fields)
    description = clip(description.strip(), max(0, min(4096, 6000 - used)))
    embed: dict[str, Any] = {
        "title": title,
        "url": message.link,
        "description": description,
        "color": _COLOR.get(message.kind, _COLOR.get(message.level, 0x7F7F7F)),
        "fields": fields,
        "footer": {"text": footer},
    }
    return Request(url, {"content": clip(message.headline, 2000), "embeds": [embed]})


TEAMS_MAX_BYTES = 24_000


def teams(message: Message, *, url: str, secret: str | None = None, now: float = 0.0) -> Request:
    """Teams Workflows webhook: an Adaptive Card 1.4 attachment (TextBlocks, a FactSet, Action.OpenUrl)."""
    facts = [{"title": "Level", "value": message.level}, {"title": "Category", "value": message.category}]
    facts.append({"title": "Node", "value": message.node})
    facts.append({"title": "GPU", "value": ", ".join(message.devices) or "-"})
    if message.kind == "digest":
        facts.extend({"title": k, "value": str(n)} for k, n in list(message.counts.items())[:20])
    body: list[dict[str, Any]] = [
        {"type": "TextBlock", "text": clip(message.headline, 500), "weight": "Bolder", "size": "Medium", "wrap": True},
        {"type": "FactSet", "facts": facts},
    ]
    for heading, text in _sections(message):
        if heading in ("Where", "Link"):
            continue
        block: dict[str, Any] = {"type": "TextBlock", "text": _clip_part(text, 4000), "wrap": True}
        if heading in ("Traceback", "Kernel"):
            block["fontType"] = "Monospace"
        body.append(block)
    card: dict[str, Any] = {
        "type": "AdaptiveCard",
        "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
        "version": "1.4",
        "body": body,
        "actions": [{"type": "Action.OpenUrl", "title": "Open incident", "url": message.link}],
    }
    payload = {
        "type": "message",
        "attachments": [
            {"contentType": "application/vnd.microsoft.card.adaptive", "contentUrl": None, "content": card}
        ],
    }
    # Shrink the longest text blocks until the whole message fits.
    while _json_size(payload) > TEAMS_MAX_BYTES:
        blocks = [b for b in body[2:] if len(b["text"]) > 40]
        if not blocks:
            break
        longest = max(blocks, key=lambda b: len(b["text"]))
        longest["text"] = clip(longest["text"], len(longest["text"]) // 2)
    return Request(url, payload)


def feishu_sign(secret: str, timestamp: int) -> str:
    """Feishu/Lark: base64(HMAC-SHA256(key = f"{timestamp}\\n{secret}", message = b""))."""
    key = f"{timestamp}\n{secret}".encode()
    return base64.b64encode(hmac.new(key, b"", hashlib.sha256).digest()).decode()


FEISHU_MAX_BYTES = 20_000


def feishu(message: Message, *, url: str, secret: str | None = None, now: float = 0.0) -> Request:
    """Feishu/Lark custom bot: an interactive card; `timestamp` and `sign` in the body when a secret is set."""
    template = {"driver": "red", "code": "orange"}.get(message.level, "grey")
    template = {"resolved": "green", "test": "blue"}.get(message.kind, template)
    content = markdown(message, limit=12_000, part_limit=3000)
    card: dict[str, Any] = {
        "config": {"wide_screen_mode": True},
        "header": {"title": {"tag": "plain_text", "content": clip(message.headline, 200)}, "template": template},
        "elements": [
            {"tag": "div", "text": {"tag": "lark_md", "content": content}},
            {
                "tag": "action",
                "actions": [
                    {
                        "tag": "button",
                        "text": {"tag": "plain_text", "content": "Open incident"},
                        "url": message.link,
                        "type": "primary",
                    }
                ],
            },
        ],
    }
    payload: dict[str, Any] = {"msg_type": "interactive", "card": card}
    if secret:
        timestamp = int(now)
        payload = {"timestamp": str(timestamp), "sign": feishu_sign(secret, timestamp), **payload}
    while _json_size(payload) > FEISHU_MAX_BYTES and len(content) > 40:
        content = clip(content, len(content) * 3 // 4)
        card["elements"][0]["text"]["content"] = content
    return Request(url, payload)


def dingtalk_sign(secret: str, timestamp_ms: int) -> str:
    """DingTalk: base64(HMAC-SHA256(key = secret, message = f"{timestamp}\\n{secret}")), not yet URL-encoded."""
    digest = hmac.new(secret.encode(), f"{timestamp_ms}\n{secret}".encode(), hashlib.sha256).digest()
    return base64.b64encode(digest).decode()


def _with_query(url: str, extra: Sequence[tuple[str, str]]) -> str:
    parts = urllib.parse.urlsplit(url)
    query = "&".join(x for x in (parts.query, urllib.parse.urlencode(list(extra))) if x)
    return urllib.parse.urlunsplit(parts._replace(query=query))


DINGTALK_MAX_BYTES = 18_000


def dingtalk(message: Message, *, url: str, secret: str | None = None, now: float = 0.0) -> Request:
    """DingTalk custom robot: markdown; with a secret, `timestamp` (ms) and `sign` in the query string."""
    text = markdown(message, limit=DINGTALK_MAX_BYTES, part_limit=3000, in_bytes=True)
    payload = {"msgtype": "markdown", "markdown": {"title": clip(message.headline, 100), "text": text}}
    if secret:
        timestamp_ms = int(now * 1000)
        url = _with_query(url, [("timestamp", str(timestamp_ms)), ("sign", dingtalk_sign(secret, timestamp_ms))])
    return Request(url, payload)


WECOM_MAX_BYTES = 4096


def wecom(message: Message, *, url: str, secret: str | None = None, now: float = 0.0) -> Request:
    """WeCom group robot: markdown, `markdown.content` at most 4096 bytes of UTF-8."""
    content = markdown(message, limit=WECOM_MAX_BYTES, part_limit=1500, in_bytes=True)
    return Request(url, {"msgtype": "markdown", "markdown": {"content": content}})


def generic(message: Message, *, url: str, secret: str | None = None, now: float = 0.0) -> Request:
    """Any receiver: the incident JSON as the API returns it, with the message kind, node, labels and link."""
    payload: dict[str, Any] = {"kind": message.kind, "node": message.node, "labels": dict(message.labels)}
    payload["link"] = message.link
    if message.kind == "digest":
        payload["counts"] = dict(message.counts)
        payload["total"] = message.total
        payload["incidents"] = [dict(item.document or {}) for item in message.items]
    else:
        payload["incident"] = dict(message.document or {})
    return Request(url, payload)


_LABEL_NAME = re.compile(r"[^a-zA-Z0-9_]")
ANNOTATION_CHARS = 4000


def _label_name(name: str) -> str:
    clean = _LABEL_NAME.sub("_", name)
    return clean if clean and not clean[0].isdigit() else f"_{clean}"


def _alert(message: Message, now: float) -> dict[str, Any]:
    labels = {_label_name(k): str(v) for k, v in message.labels.items()}
    labels.update(
        {
            "alertname": ALERTNAME,
            "node": message.node,
            "level": message.level,
            "category": message.category,
            "device": message.devices[0] if message.devices else "",
            "fingerprint": message.fingerprint,
        }
    )
    if "job" in message.labels:
        labels["job"] = str(message.labels["job"])
    annotations = {
        "title": clip(message.title, ANNOTATION_CHARS),
        "summary": clip(message.summary or message.headline, ANNOTATION_CHARS),
        "hint": clip(message.hint, ANNOTATION_CHARS),
        "evidence": clip("\n".join(message.evidence), ANNOTATION_CHARS),
        "incident": message.incident_id,
    }
    ends = now if message.kind == "resolved" else now + ALERTMANAGER_HOLD_S
    alert: dict[str, Any] = {"labels": labels, "annotations": annotations, "generatorURL": message.link}
    starts = message.first_seen
    alert["startsAt"] = starts if isinstance(starts, str) and starts else _iso(now)
    if alert["startsAt"] > _iso(ends):
        alert["startsAt"] = _iso(ends)
    alert["endsAt"] = _iso(ends)
    return alert


def alertmanager(message: Message, *, url: str, secret: str | None = None, now: float = 0.0) -> Request:
    """Alertmanager `POST /api/v2/alerts`: one postableAlert per incident (a digest posts each of its items).

    Firing: `endsAt` = now + ALERTMANAGER_HOLD_S (the worker re-posts each minute); resolved: `endsAt` = now.
    `url` is the Alertmanager's base URL; `/api/v2/alerts` is added unless it is already there.
    """
    target = url if url.rstrip("/").endswith("/api/v2/alerts") else url.rstrip("/") + "/api/v2/alerts"
    messages = message.items if message.kind == "digest" else (message,)
    return Request(target, [_alert(m, now) for m in messages])


BUILDERS: dict[str, Builder] = {
    "slack": slack,
    "mattermost": mattermost,
    "discord": discord,
    "teams": teams,
    "feishu": feishu,
    "dingtalk": dingtalk,
    "wecom": wecom,
    "generic": generic,
    "alertmanager": alertmanager,
}


def build(sink_kind: str, message: Message, *, url: str, secret: str | None = None, now: float) -> Request:
    """The request that sink kind `sink_kind` takes for `message`, signed with `secret` at time `now`."""
    try:
        builder = BUILDERS[sink_kind]
    except KeyError:
        raise ValueError(f"unknown sink kind {sink_kind!r}; known: {', '.join(BUILDERS)}") from None
    return builder(message, url=url, secret=secret, now=now)


# -- secrets -------------------------------------------------------------------------

_SECRET_PARAMS = {"access_token", "token", "key", "sign", "secret", "signature", "sig", "apikey", "api_key", "code"}
PATH_KEPT = 12


def redact(url: str) -> str:
    """A webhook URL safe to show: scheme, host and the first few chars of the path; tokens replaced by ***.

    `https://hooks.slack.com/services/T000/B000/XXXX` -> `https://hooks.slack.com/services/T0***`;
    query values of token-like parameters (`access_token`, `key`, `sign`, ...) become `***`; user info is hidden.
    """
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "***"
    if not parts.scheme or not host:
        return clip(url, 8) + "***" if url else ""
    netloc = ("***@" if parts.username or parts.password else "") + host + (f":{port}" if port else "")
    path = parts.path if len(parts.path) <= PATH_KEPT else parts.path[:PATH_KEPT] + "***"
    pairs = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    query = "&".join(f"{k}={'***' if k.lower() in _SECRET_PARAMS else v}" for k, v in pairs)
    return urllib.parse.urlunsplit((parts.scheme, netloc, path, query, ""))

"""Alert payloads: every platform's documented shape, field by field, inside its limits, from real incidents."""

from __future__ import annotations

import base64
import copy
import hashlib
import hmac
import json
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from triage.alerts import formats
from triage.alerts.formats import BUILDERS, Message, build, digest_for, message_for, redact
from triage.engine import Engine
from triage.render import incident_to_dict
from triage.scan import scan

DATA = Path(__file__).parent / "data"
NOW = 1_800_000_000.0
BASE = "http://node7:8765"
ELLIPSIS = "…"


@pytest.fixture(scope="module")
def documents() -> dict[str, dict[str, Any]]:
    """Real incident documents: a driver-level page fault with kernel lines, code-level ones with tracebacks."""
    engine = Engine.load()
    found: dict[str, dict[str, Any]] = {}
    runs = [
        ([DATA / "example/kern.log"], [DATA / "example/train.log"]),
        ([], [DATA / "torch/torchrun-different.log"]),
        ([DATA / "cuda/device_assert.kernel.txt"], [DATA / "cuda/device_assert.log"]),
        ([], [DATA / "cuda/oom.log"]),
    ]
    for kernels, logs in runs:
        for incident in scan(engine, [str(k) for k in kernels], [str(p) for p in logs]).incidents:
            found.setdefault(incident.category, incident_to_dict(incident))
    assert "vm_page_fault" in found and "dtype_config" in found
    return found


@pytest.fixture(scope="module")
def driver(documents: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return documents["vm_page_fault"]


@pytest.fixture(scope="module")
def code(documents: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return documents["dtype_config"]


@pytest.fixture(scope="module")
def huge(driver: dict[str, Any], code: dict[str, Any]) -> dict[str, Any]:
    """A real document blown up: a 1 MB evidence line, hint and title, 1 MB traceback and kernel lines, multibyte."""
    document = copy.deepcopy(driver)
    mb = "x" * 1_000_000
    wide = "显存错误" * 250_000  # 1M characters, 3 MB of UTF-8
    document["title"] = "T" + mb
    document["hint"] = wide
    document["evidence"] = [wide, mb, *document["evidence"]]
    document["devices"] = [f"0000:{i:02x}:00.0" for i in range(200)]
    document["kernel_events"][0]["lines"] = [wide, mb] * 3
    document["program_failures"] = copy.deepcopy(code["program_failures"])
    document["program_failures"][0]["lines"] = ["```" + mb, wide] * 3
    return document


def messages(driver: dict[str, Any], code: dict[str, Any], huge: dict[str, Any]) -> list[Message]:
    labels = {"cluster": "c1", "job": "job-42"}
    out = [
        message_for(d, node="node7", base_url=BASE, kind=k, labels=labels)
        for d in (driver, code, huge)
        for k in ("new", "update", "resolved", "test")
    ]
    out.append(digest_for([driver, code, huge] * 40, node="node7", base_url=BASE, labels=labels))
    return out


# -- the message ------------------------------------------------------------------


def test_message_follows_the_issue_order_and_content(driver: dict[str, Any], code: dict[str, Any]) -> None:
    message = message_for(driver, node="node7", base_url=BASE + "/", kind="new")
    assert (message.level, message.category) == ("driver", "vm_page_fault")
    assert message.devices == ("0000:0b:00.0",)
    assert message.link == f"{BASE}/incidents/{driver['id']}"
    assert message.kernel_lines and all(line in driver["kernel_events"][0]["lines"] for line in message.kernel_lines)
    assert message.traceback[0] == driver["program_failures"][0]["lines"][0]
    assert message.hint == driver["hint"] and message.fingerprint == driver["fingerprint"]
    text = formats.markdown(message, limit=100_000)
    order = [
        "DRIVER vm_page_fault",
        "node node7, GPU 0000:0b:00.0",
        f"**What**\n{driver['title']}",
        message.traceback[0],
        message.kernel_lines[0],
        driver["hint"][:40],
        message.link,
    ]
    positions = [text.index(part) for part in order]
    assert positions == sorted(positions)
    coded = message_for(code, node="n", base_url=BASE)
    assert coded.traceback[0].startswith("[rank") and coded.kernel_lines == ()
    assert "RuntimeError" in "\n".join(coded.traceback)


def test_kinds_are_marked(driver: dict[str, Any]) -> None:
    heads = {
        k: message_for(driver, node="n", base_url=BASE, kind=k).headline for k in ("new", "update", "resolved", "test")
    }
    assert heads["new"].startswith("DRIVER vm_page_fault on n: ")
    assert heads["update"].startswith("[UPDATE] ") and heads["resolved"].startswith("[RESOLVED] ")
    assert heads["test"].startswith("[TEST] ")
    with pytest.raises(ValueError):
        message_for(driver, node="n", base_url=BASE, kind="digest")


def test_digest_counts_and_ranks(
    driver: dict[str, Any], code: dict[str, Any], documents: dict[str, dict[str, Any]]
) -> None:
    burst = [code] * 7 + [driver] * 3 + list(documents.values())
    digest = digest_for(burst, node="node7", base_url=BASE, top=3)
    assert digest.kind == "digest" and digest.total == len(burst)
    assert digest.counts["code/dtype_config"] == 8 and digest.counts["driver/vm_page_fault"] == 4
    assert sum(digest.counts.values()) == len(burst)
    assert len(digest.items) == 3 and digest.items[0].level == "driver"
    text = formats.markdown(digest, limit=100_000)
    assert f"{len(burst)} incident(s)" in text and f"and {len(burst) - 3} more" in text


def test_clip_helpers() -> None:
    assert formats.clip("abc", 3) == "abc" and formats.clip("abcd", 3) == "ab…"
    cut = formats.clip_bytes("é" * 10, 8)
    assert cut.endswith(ELLIPSIS) and len(cut.encode()) <= 8 and cut == "éé…"
    assert formats.clip_bytes("ab", 8) == "ab"


# -- each platform's shape --------------------------------------------------------


def test_slack_blocks(driver: dict[str, Any]) -> None:
    message = message_for(driver, node="node7", base_url=BASE)
    request = build("slack", message, url="https://hooks.slack.com/services/T0/B0/x", now=NOW)
    assert request.method == "POST" and request.url == "https://hooks.slack.com/services/T0/B0/x"
    body = request.json
    assert set(body) == {"text", "blocks"} and isinstance(body["text"], str) and body["text"] == message.headline
    blocks = body["blocks"]
    assert blocks[0]["type"] == "header" and blocks[0]["text"]["type"] == "plain_text"
    assert blocks[-1]["type"] == "context" and message.link in blocks[-1]["elements"][0]["text"]
    sections = [b for b in blocks if b["type"] == "section"]
    assert sections and all(b["text"]["type"] == "mrkdwn" for b in sections)
    joined = "\n".join(b["text"]["text"] for b in sections)
    assert message.traceback[0] in joined and message.kernel_lines[0] in joined and driver["hint"] in joined


def test_mattermost(driver: dict[str, Any]) -> None:
    message = message_for(driver, node="node7", base_url=BASE)
    body = build("mattermost", message, url="https://mm.example/hooks/abc", now=NOW).json
    assert body["text"] == message.headline
    (attachment,) = body["attachments"]
    assert set(attachment) == {"fallback", "color", "title", "title_link", "text"}
    assert attachment["title_link"] == message.link and attachment["color"].startswith("#")
    assert message.traceback[0] in attachment["text"]


def test_discord(driver: dict[str, Any]) -> None:
    message = message_for(driver, node="node7", base_url=BASE)
    body = build("discord", message, url="https://discord.com/api/webhooks/1/t", now=NOW).json
    assert body["content"] == message.headline
    (embed,) = body["embeds"]
    assert embed["title"] == message.headline and embed["url"] == message.link
    assert isinstance(embed["color"], int) and 0 <= embed["color"] <= 0xFFFFFF
    assert message.kernel_lines[0] in embed["description"] and driver["hint"][:100] in embed["description"]
    assert all(set(f) == {"name", "value", "inline"} for f in embed["fields"])
    assert isinstance(embed["footer"]["text"], str)


def test_teams_adaptive_card(driver: dict[str, Any]) -> None:
    message = message_for(driver, node="node7", base_url=BASE)
    body = build("teams", message, url="https://prod.westus.logic.azure.com/workflows/x", now=NOW).json
    assert body["type"] == "message"
    (attachment,) = body["attachments"]
    assert attachment["contentType"] == "application/vnd.microsoft.card.adaptive"
    card = attachment["content"]
    assert (
        card["type"] == "AdaptiveCard"
        and card["version"] == "1.4"
        and card["$schema"].startswith("http://adaptivecards.io/")
    )
    assert card["body"][0]["type"] == "TextBlock" and card["body"][0]["text"] == message.headline
    facts = {f["title"]: f["value"] for f in card["body"][1]["facts"]}
    assert card["body"][1]["type"] == "FactSet"
    assert facts == {"Level": "driver", "Category": "vm_page_fault", "Node": "node7", "GPU": "0000:0b:00.0"}
    assert all(b["type"] == "TextBlock" and isinstance(b["text"], str) for b in card["body"][2:])
    (action,) = card["actions"]
    assert action == {"type": "Action.OpenUrl", "title": "Open incident", "url": message.link}


def test_feishu_card_and_signature(driver: dict[str, Any]) -> None:
    message = message_for(driver, node="node7", base_url=BASE)
    url = "https://open.feishu.cn/open-apis/bot/v2/hook/abc"
    unsigned = build("feishu", message, url=url, now=NOW).json
    assert unsigned["msg_type"] == "interactive" and "sign" not in unsigned and "timestamp" not in unsigned
    card = unsigned["card"]
    assert (
        card["header"]["title"] == {"tag": "plain_text", "content": message.headline}
        and card["header"]["template"] == "red"
    )
    div, action = card["elements"]
    assert div["tag"] == "div" and div["text"]["tag"] == "lark_md" and message.kernel_lines[0] in div["text"]["content"]
    assert action["tag"] == "action" and action["actions"][0]["url"] == message.link
    signed = build("feishu", message, url=url, secret="s3cr3t", now=NOW + 0.9)
    assert signed.url == url
    timestamp = signed.json["timestamp"]
    assert timestamp == str(int(NOW)) and isinstance(timestamp, str)
    # Independently: HMAC-SHA256 keyed with "timestamp\nsecret" over an empty message, base64.
    expected = base64.b64encode(hmac.new(f"{timestamp}\ns3cr3t".encode(), b"", hashlib.sha256).digest()).decode()
    assert signed.json["sign"] == expected
    # A fixed vector, computed once by hand (Python and `openssl dgst -sha256 -hmac`).
    assert formats.feishu_sign("SEC123", 1700000000) == "j/tImR0k8vYXRsYw0+GHVQkV1v/J/8obOuMU7PE/KDo="


def test_dingtalk_markdown_and_signature(code: dict[str, Any]) -> None:
    message = message_for(code, node="node7", base_url=BASE)
    url = "https://oapi.dingtalk.com/robot/send?access_token=tok123"
    unsigned = build("dingtalk", message, url=url, now=NOW)
    assert unsigned.url == url
    assert unsigned.json["msgtype"] == "markdown"
    assert set(unsigned.json["markdown"]) == {"title", "text"} and "RuntimeError" in unsigned.json["markdown"]["text"]
    signed = build("dingtalk", message, url=url, secret="SECabc", now=NOW + 0.25)
    assert signed.json == unsigned.json
    parts = urllib.parse.urlsplit(signed.url)
    assert parts.netloc == "oapi.dingtalk.com" and parts.path == "/robot/send"
    query = parts.query.split("&")
    assert query[0] == "access_token=tok123"
    timestamp = query[1].removeprefix("timestamp=")
    assert timestamp == str(int((NOW + 0.25) * 1000))
    # Independently: HMAC-SHA256 keyed with the secret over "timestamp\nsecret", base64, then URL-encoded.
    raw = hmac.new(b"SECabc", f"{timestamp}\nSECabc".encode(), hashlib.sha256).digest()
    assert query[2] == "sign=" + urllib.parse.quote_plus(base64.b64encode(raw))
    assert formats.dingtalk_sign("SEC123", 1700000000000) == "lkcPI1uoxBY1gUnCnnPH1Kkru0Hqjo7rFpA3haIVhEQ="
    fixed = build("dingtalk", message, url=url, secret="SEC123", now=1700000000.0).url
    assert fixed.endswith("&timestamp=1700000000000&sign=lkcPI1uoxBY1gUnCnnPH1Kkru0Hqjo7rFpA3haIVhEQ%3D")


def test_wecom(code: dict[str, Any]) -> None:
    message = message_for(code, node="node7", base_url=BASE)
    body = build("wecom", message, url="https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=k", now=NOW).json
    assert body["msgtype"] == "markdown" and set(body["markdown"]) == {"content"}
    assert message.headline in body["markdown"]["content"] and len(body["markdown"]["content"].encode()) <= 4096


def test_generic_is_the_api_document(driver: dict[str, Any], code: dict[str, Any]) -> None:
    message = message_for(driver, node="node7", base_url=BASE, kind="update", labels={"job": "j"})
    body = build("generic", message, url="http://r/", now=NOW).json
    assert body["incident"] == driver and body["kind"] == "update" and body["link"] == message.link
    assert body["node"] == "node7" and body["labels"] == {"job": "j"}
    json.dumps(body)
    digest = build("generic", digest_for([driver, code], node="n", base_url=BASE), url="http://r/", now=NOW).json
    assert digest["kind"] == "digest" and digest["total"] == 2 and digest["incidents"][0] == driver


def test_alertmanager_firing_and_resolved(driver: dict[str, Any], code: dict[str, Any]) -> None:
    labels = {"cluster": "c1", "rack": "r-3", "job": "job-42"}
    firing = message_for(driver, node="node7", base_url=BASE, labels=labels)
    request = build("alertmanager", firing, url="http://127.0.0.1:9093", now=NOW)
    assert request.url == "http://127.0.0.1:9093/api/v2/alerts"
    (alert,) = request.json
    assert set(alert) == {"labels", "annotations", "generatorURL", "startsAt", "endsAt"}
    assert alert["labels"] == {
        "alertname": "GPUTriageIncident",
        "node": "node7",
        "level": "driver",
        "category": "vm_page_fault",
        "device": "0000:0b:00.0",
        "fingerprint": driver["fingerprint"],
        "job": "job-42",
        "cluster": "c1",
        "rack": "r-3",
    }
    assert all(isinstance(v, str) for v in alert["labels"].values())
    notes = alert["annotations"]
    assert set(notes) == {"title", "summary", "hint", "evidence", "incident"}
    assert notes["title"] == driver["title"] and notes["hint"] == driver["hint"] and notes["incident"] == driver["id"]
    assert notes["summary"] == driver["evidence"][0] and notes["evidence"].startswith(driver["evidence"][0])
    assert alert["generatorURL"] == f"{BASE}/incidents/{driver['id']}"
    assert alert["startsAt"] == driver["first_seen"]
    assert alert["endsAt"] == formats._iso(NOW + formats.ALERTMANAGER_HOLD_S)
    resolved = message_for(driver, node="node7", base_url=BASE, kind="resolved", labels=labels)
    (done,) = build("alertmanager", resolved, url="http://am:9093/api/v2/alerts", now=NOW).json
    assert done["endsAt"] == formats._iso(NOW) and done["labels"] == alert["labels"]
    nojob = build("alertmanager", message_for(code, node="n", base_url=BASE), url="http://am:9093/", now=NOW).json[0]
    assert "job" not in nojob["labels"] and nojob["labels"]["device"] == ""
    digest = digest_for([driver, code], node="n", base_url=BASE)
    assert len(build("alertmanager", digest, url="http://am:9093", now=NOW).json) == 2


# -- limits ------------------------------------------------------------------------


def _slack_ok(body: dict[str, Any]) -> None:
    assert len(body["text"]) <= 3000 and len(body["blocks"]) <= 50
    for block in body["blocks"]:
        if block["type"] == "header":
            assert len(block["text"]["text"]) <= 150
        elif block["type"] == "section":
            assert len(block["text"]["text"]) <= 3000
        else:
            assert block["type"] == "context" and len(block["elements"]) <= 10
            assert all(len(e["text"]) <= 3000 for e in block["elements"])


def _discord_ok(body: dict[str, Any]) -> None:
    assert len(body["content"]) <= 2000 and len(body["embeds"]) <= 10
    for embed in body["embeds"]:
        assert len(embed["title"]) <= 256 and len(embed["description"]) <= 4096
        assert len(embed["fields"]) <= 25 and len(embed["footer"]["text"]) <= 2048
        assert all(len(f["name"]) <= 256 and len(f["value"]) <= 1024 for f in embed["fields"])
        total = len(embed["title"]) + len(embed["description"]) + len(embed["footer"]["text"])
        assert total + sum(len(f["name"]) + len(f["value"]) for f in embed["fields"]) <= 6000


def _size(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False).encode())


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_huge_incidents_stay_inside_every_limit(
    kind: str, driver: dict[str, Any], code: dict[str, Any], huge: dict[str, Any]
) -> None:
    for message in messages(driver, code, huge):
        request = build(kind, message, url="https://example.test/hook?key=k", secret="s", now=NOW)
        body = request.json
        json.dumps(body)
        if kind == "slack":
            _slack_ok(body)
        elif kind == "mattermost":
            assert len(body["text"]) + len(body["attachments"][0]["text"]) <= 16383
        elif kind == "discord":
            _discord_ok(body)
        elif kind == "teams":
            assert _size(body) <= 28_000
        elif kind == "feishu" or kind == "dingtalk":
            assert _size(body) <= 20_000
        elif kind == "wecom":
            assert len(body["markdown"]["content"].encode()) <= 4096
        elif kind == "alertmanager":
            for alert in body:
                assert all(len(v) <= formats.ANNOTATION_CHARS for v in alert["annotations"].values())
                assert len(alert["labels"]["device"]) < 100
    # The huge one was visibly cut, never dropped.
    big = message_for(huge, node="node7", base_url=BASE)
    body = build(kind, big, url="https://example.test/hook", now=NOW).json
    if kind != "generic":
        assert ELLIPSIS in json.dumps(body, ensure_ascii=False)
        assert big.link in json.dumps(body, ensure_ascii=False)


def test_a_cut_code_block_is_closed(huge: dict[str, Any]) -> None:
    message = message_for(huge, node="n", base_url=BASE)
    for block in build("slack", message, url="u", now=NOW).json["blocks"]:
        text = block.get("text", {}).get("text", "")
        assert text.count("```") % 2 == 0


# -- redaction ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://hooks.slack.com/services/T000/B000/XXXXXXXX", "https://hooks.slack.com/services/T0***"),
        ("https://discord.com/api/webhooks/123456/tok-en_value", "https://discord.com/api/webhook***"),
        ("https://open.feishu.cn/open-apis/bot/v2/hook/0123-abcd", "https://open.feishu.cn/open-apis/b***"),
        (
            "https://oapi.dingtalk.com/robot/send?access_token=abcdef",
            "https://oapi.dingtalk.com/robot/send?access_token=***",
        ),
        (
            "https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=693a-91f6",
            "https://qyapi.weixin.qq.com/cgi-bin/web***?key=***",
        ),
        (
            "https://x.test/a?sign=abc&timestamp=1&access_token=t",
            "https://x.test/a?sign=***&timestamp=1&access_token=***",
        ),
        ("http://user:pw@127.0.0.1:9093/api/v2/alerts", "http://***@127.0.0.1:9093/api/v2/aler***"),
        ("http://am:9093", "http://am:9093"),
    ],
)
def test_redact(url: str, expected: str) -> None:
    assert redact(url) == expected


def test_redact_hides_every_token() -> None:
    for token in ("XXXXXXXX", "tok-en_value", "abcdef", "693a-91f6", "pw"):
        for url in (
            f"https://h.test/services/AAAAAAAAAAAAAA/{token}",
            f"https://h.test/s?key={token}",
            f"https://u:{token}@h.test/",
        ):
            assert token not in redact(url)
    assert redact("not a url at all, token") == "not a u…***"

"""triage.alerts.routing: sink filters, the job read from a log path, the labels of an alert."""

from __future__ import annotations

from typing import Any

import pytest

from triage.alerts.routing import job_of, labels_for, sink_wants
from triage.config import Config, SinkConfig, parse_config


def sink(**keys: str | list[str]) -> SinkConfig:
    lines = ['name = "s"', 'kind = "slack"', 'url = "https://hooks.slack.com/services/T/B/X"']
    for key, value in keys.items():
        lines.append(f"{key} = {value!r}".replace("'", '"'))
    return parse_config("[[alerts.sinks]]\n" + "\n".join(lines)).alerts.sinks[0]


def incident(level: str, category: str, *origins: str) -> dict[str, Any]:
    failures = [{"origin": origin, "lines": ["Traceback"]} for origin in origins]
    return {"id": "i1", "level": level, "category": category, "program_failures": failures, "kernel_events": []}


HANG = incident("driver", "gpu_hang")
OOM = incident("code", "oom")
NAN = incident("code", "nan_loss")
COLLECTIVE = incident("code", "collective_failure")


def test_a_sink_without_filters_wants_everything() -> None:
    assert all(sink_wants(sink(), doc) for doc in (HANG, OOM, NAN, COLLECTIVE))


def test_min_level_driver_passes_only_driver_level() -> None:
    driver_only = sink(min_level="driver")
    assert sink_wants(driver_only, HANG)
    assert not sink_wants(driver_only, OOM) and not sink_wants(driver_only, COLLECTIVE)
    assert sink_wants(sink(min_level="code"), OOM)


def test_categories_and_exclusions() -> None:
    only = sink(categories=["oom", "gpu_hang"])
    assert [sink_wants(only, doc) for doc in (HANG, OOM, NAN)] == [True, True, False]
    excluded = sink(exclude_categories=["nan_loss"])
    assert [sink_wants(excluded, doc) for doc in (HANG, OOM, NAN)] == [True, True, False]
    both = sink(categories=["oom", "nan_loss"], exclude_categories=["nan_loss"])
    assert [sink_wants(both, doc) for doc in (HANG, OOM, NAN)] == [False, True, False]
    driver_hangs = sink(min_level="driver", categories=["gpu_hang", "oom"])
    assert [sink_wants(driver_hangs, doc) for doc in (HANG, OOM)] == [True, False]


def test_a_document_without_level_passes_only_code_sinks() -> None:
    assert sink_wants(sink(), {}) and not sink_wants(sink(min_level="driver"), {})


@pytest.mark.parametrize(
    ("path", "template", "expected"),
    [
        ("/shared/logs/llama-70b-pretrain/rank3.log", "/shared/logs/{job}/rank{rank}.log",
         {"job": "llama-70b-pretrain", "rank": "3"}),
        ("/shared/logs/sft_2024-06-01T12:00/rank127.log", "/shared/logs/{job}/rank{rank}.log",
         {"job": "sft_2024-06-01T12:00", "rank": "127"}),
        ("/shared/logs/job.42/rank0.log", "/shared/logs/{job}/rank{rank}.log", {"job": "job.42", "rank": "0"}),
        ("/mnt/lustre/proj/logs/run7/node03/stderr.txt", "/mnt/lustre/{team}/logs/{job}/{host}/stderr.txt",
         {"team": "proj", "job": "run7", "host": "node03"}),
        ("/var/log/training/slurm-918273.out", "/var/log/training/slurm-{job}.out", {"job": "918273"}),
        ("/var/log/training/918273/918273-r5.log", "/var/log/training/{job}/{job}-r{rank}.log",
         {"job": "918273", "rank": "5"}),
        ("/data/a/b/logs/run7/rank2.log", "logs/{job}/rank{rank}.log", {"job": "run7", "rank": "2"}),
        ("/var/log/training/a/b.log", "/var/log/training/{job}/{rank}.log", {"job": "a", "rank": "b"}),
        # what does not match gives nothing: another directory, a deeper path, a field that differs
        ("/other/logs/run7/rank2.log", "/shared/logs/{job}/rank{rank}.log", {}),
        ("/shared/logs/a/b/rank2.log", "/shared/logs/{job}/rank{rank}.log", {}),
        ("/shared/logs/run7/rank2.log.1", "/shared/logs/{job}/rank{rank}.log", {}),
        ("/var/log/training/111/222-r5.log", "/var/log/training/{job}/{job}-r{rank}.log", {}),
        ("/data/x-logs/run7/rank2.log", "logs/{job}/rank{rank}.log", {}),
        ("/shared/logs/run7/rank2.log", "", {}),
        ("", "/shared/logs/{job}/rank{rank}.log", {}),
        # regex characters in the literal part are literal
        ("/shared/logs(1)/run+7/rank2.log", "/shared/logs(1)/{job}/rank{rank}.log", {"job": "run+7", "rank": "2"}),
        ("/shared/logsX1/run7/rank2.log", "/shared/logs.1/{job}/rank{rank}.log", {}),
    ],
)  # fmt: skip
def test_job_of(path: str, template: str, expected: dict[str, str]) -> None:
    assert job_of(path, template) == expected


def test_job_of_a_malformed_template_is_an_error() -> None:
    with pytest.raises(ValueError, match="is not a"):
        job_of("/x", "/x/{job:>3}")


def config(extra: str = "") -> Config:
    return parse_config('[alerts]\nnode = "gpu-node-17"\nlabels = { cluster = "a100-east", rack = "r12" }\n' + extra)


def test_labels_are_static_labels_and_node() -> None:
    assert labels_for(HANG, config()) == {"cluster": "a100-east", "rack": "r12", "node": "gpu-node-17"}
    assert labels_for(HANG, Config()) == {"node": Config().alerts.node}
    assert labels_for(HANG, config().alerts) == labels_for(HANG, config())


def test_job_comes_from_the_first_failure_whose_path_matches() -> None:
    template = 'job_from_path = "/shared/logs/{job}/rank{rank}.log"\n'
    doc = incident("code", "collective_failure", "/tmp/other.log", "/shared/logs/llama/rank3.log",
                   "/shared/logs/other-job/rank0.log")  # fmt: skip
    labels = labels_for(doc, config(template))
    assert labels == {"cluster": "a100-east", "rack": "r12", "node": "gpu-node-17", "job": "llama"}
    assert "job" not in labels_for(doc, config())  # no template: no job
    assert "job" not in labels_for(HANG, config(template))  # kernel evidence only: no job
    assert "job" not in labels_for({"program_failures": [{"origin": None}]}, config(template))


def test_labels_for_does_not_change_the_config() -> None:
    cfg = config()
    labels_for(HANG, cfg)["cluster"] = "changed"
    assert dict(cfg.alerts.labels)["cluster"] == "a100-east"


def test_alerts_for_new_update_rate_limit_and_filters() -> None:
    from triage.alerts.routing import alerts_for
    from triage.config import parse_config
    from triage.store import StoredIncident

    config = parse_config(
        '[[alerts.sinks]]\nname = "all"\nkind = "slack"\nurl = "https://hooks.slack.com/services/T0/B0/x"\n'
        '[[alerts.sinks]]\nname = "oncall"\nkind = "generic"\nurl = "http://127.0.0.1:9/x"\nmin_level = "driver"\n',
        "t.toml",
    )

    def stored(level: str, created: float, updated: float, merged: str | None = None) -> StoredIncident:
        document = {"id": "inc-1", "level": level, "category": "oom" if level == "code" else "gpu_reset"}
        return StoredIncident("inc-1", level, document["category"], "fp", 1.0, 2.0, created, updated, document, merged)

    first = alerts_for([stored("code", 10, 10)], config.alerts, now=10, last_delivered=lambda s, i: None)
    assert [(a.sink, a.kind, a.due) for a in first] == [("all", "new", 10)]
    relabelled = alerts_for([stored("driver", 10, 20)], config.alerts, now=20, last_delivered=lambda s, i: 15.0)
    assert [(a.sink, a.kind, a.due) for a in relabelled] == [("all", "update", 75.0), ("oncall", "update", 75.0)]
    assert (
        alerts_for([stored("driver", 10, 30, merged="inc-0")], config.alerts, now=30, last_delivered=lambda s, i: None)
        == []
    )

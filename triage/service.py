"""`triage serve`: the daemon that wires sources, the live engine, the store and the API.

Threads: one per source (reading), one processing thread (live correlation and
the store's single writer), one for the HTTP server; the main thread handles
signals and talks to systemd. SIGHUP reloads the configuration and the patterns
(a bad new file is reported and the old one kept); SIGTERM stops the sources,
stores what they handed over, and exits.
"""

from __future__ import annotations

import logging
import queue
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn

from . import __version__
from .alerts.routing import alerts_for
from .alerts.worker import AlertWorker
from .api import create_app
from .config import Config, ConfigError, apply_overrides, load_config, validate
from .engine import Engine
from .live import LiveCorrelator
from .notify import notify, watchdog_interval
from .patterns import PatternError
from .sources import Batch, Source, SourceHealth
from .sources.files import FileSource
from .sources.kernel import kernel_sources
from .store import Store

log = logging.getLogger("triage")

#: A source that has not made progress for this long is dead (no WATCHDOG=1, /healthz 503).
STALE_AFTER = 30.0
#: How often retention runs.
RETENTION_EVERY = 3600.0


@dataclass(slots=True)
class Pipeline:
    """What one configuration runs: the engine and the sources reading with it."""

    engine: Engine
    sources: list[Source] = field(default_factory=list)


class Daemon:
    def __init__(self, config: Config, *, config_path: Path | None = None, overrides: dict[str, Any] | None = None):
        self.config = config
        self.config_path = config_path
        self.overrides = overrides or {}
        self.store = Store(Path(config.state.dir) / "triage.db")
        self._started_marker = Path(config.state.dir) / "started"
        self.batches: queue.Queue[Batch] = queue.Queue(maxsize=1000)
        self.live = LiveCorrelator(horizon=config.correlation.horizon_hours * 3600.0)
        self.pipeline: Pipeline | None = None
        self.stopping = threading.Event()
        self.reload_requested = threading.Event()
        self._finish = threading.Event()  # the processing thread stores what is queued, then ends
        self._processor = threading.Thread(target=self._process, name="process", daemon=True)
        self._server: uvicorn.Server | None = None
        self._server_thread: threading.Thread | None = None
        self._processed = 0
        self._process_error: str | None = None
        self.alerts: AlertWorker | None = None

    # -- sources -------------------------------------------------------------

    @staticmethod
    def _load_engine(config: Config) -> Engine:
        return Engine.load([Path(d) for d in config.patterns.dirs if Path(d).is_dir()])

    def _build_pipeline(self, config: Config, engine: Engine) -> Pipeline:
        positions = self.store.positions()
        # The very first start on this node reads existing logs from their end; later ones resume.
        first_start = not positions and not self._started_marker.exists()
        sources: list[Source] = list(
            kernel_sources(
                config.kernel.source, engine, positions, journal_directory=config.kernel.journal_directory or None
            )
        )
        file_positions = {key: value for key, value in positions.items() if key.startswith("file:")}
        if config.logs.watch:
            sources.append(
                FileSource(
                    engine,
                    list(config.logs.watch),
                    positions=file_positions,
                    first_start=first_start,
                    existing_from_end=config.logs.existing_from_end,
                    rescan_interval=config.logs.rescan_interval,
                    quiet_flush=config.logs.quiet_flush,
                )
            )
        return Pipeline(engine, sources)

    def _start_pipeline(self, pipeline: Pipeline) -> None:
        for source in pipeline.sources:
            source.start(self.batches.put)
            log.info("source %s started", source.name)
        self.pipeline = pipeline
        self._started_marker.touch(exist_ok=True)

    def _stop_pipeline(self) -> None:
        if self.pipeline is None:
            return
        for source in self.pipeline.sources:
            source.stop()
        self._drain()
        self.pipeline = None

    # -- processing ----------------------------------------------------------

    def _process(self) -> None:
        last_retention = 0.0
        while not self._finish.is_set() or not self.batches.empty():
            try:
                batch = self.batches.get(timeout=0.5)
            except queue.Empty:
                batch = None
            if batch is not None:
                self._handle(batch)
            if time.time() - last_retention > RETENTION_EVERY:
                last_retention = time.time()
                self._retain()

    def _handle(self, batch: Batch) -> None:
        try:
            commit = self.live.add(batch.events, batch.failures)
            commit.positions.update(batch.positions)
            if self.config.alerts.sinks:  # queued in the same transaction as the change they report
                commit.alerts.extend(
                    alerts_for(
                        commit.incidents,
                        self.config.alerts,
                        now=time.time(),
                        last_delivered=self.store.last_delivered,
                    )
                )
            self.store.commit(commit)
            self._processed += 1
            for incident in commit.incidents:
                if incident.merged_into:
                    log.info("incident %s merged into %s", incident.id, incident.merged_into)
                else:
                    log.info(
                        "incident %s %s/%s: %s",
                        incident.id,
                        incident.level,
                        incident.category,
                        incident.document.get("title"),
                    )
        except Exception as error:  # a bug must not stop the daemon: log it, count it, go on
            self._process_error = f"{type(error).__name__}: {error}"
            log.exception("could not process a batch from %s", batch.source)
        finally:
            self.batches.task_done()

    def _drain(self) -> None:
        """Wait until the processing thread stored everything handed over."""
        if self._processor.is_alive() and not self._finish.is_set():
            self.batches.join()
        else:
            while not self.batches.empty():
                self._handle(self.batches.get())

    def _retain(self) -> None:
        state = self.config.state
        removed = self.store.retain(max_age=state.retention_days * 86400.0, max_count=state.max_incidents)
        if removed:
            log.info("retention removed %d incident(s)", removed)

    # -- alerts --------------------------------------------------------------

    def _start_alerts(self) -> None:
        """The delivery worker drains the outbox; with no sink configured there is none."""
        if self.alerts is not None:
            self.alerts.stop()
            self.alerts = None
        if self.config.alerts.sinks:
            self.alerts = AlertWorker(
                self.store, self.config.alerts, base_url=self.config.alerts_base_url, node=self.config.alerts.node
            )
            self.alerts.start()
            log.info("alerts: %d sink(s)", len(self.config.alerts.sinks))

    # -- health --------------------------------------------------------------

    def health(self) -> list[SourceHealth]:
        reports = [source.health() for source in (self.pipeline.sources if self.pipeline else [])]
        processing = SourceHealth(
            name="processing",
            alive=self._processor.is_alive(),
            last_progress=time.time() if self._processor.is_alive() else None,
            records=self._processed,
            error=self._process_error,
            detail={"queued": self.batches.qsize()},
        )
        return [*reports, processing]

    def all_progressing(self) -> bool:
        now = time.time()
        return all(
            report.alive and report.last_progress is not None and now - report.last_progress < STALE_AFTER
            for report in self.health()
        )

    # -- HTTP ----------------------------------------------------------------

    def _start_server(self) -> None:
        host, port = self.config.server.address
        app = create_app(
            self.store,
            health=self.health,
            token=self.config.server.token or None,
            version=__version__,
            stale_after=STALE_AFTER,
        )
        server_config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(server_config)
        self._server_thread = threading.Thread(target=self._server.run, name="http", daemon=True)
        self._server_thread.start()
        deadline = time.time() + 10
        while not self._server.started and self._server_thread.is_alive() and time.time() < deadline:
            time.sleep(0.02)
        if not self._server.started:
            raise OSError(f"cannot listen on {self.config.server.listen}")
        log.info("listening on %s; try: curl %s/incidents", self.config.server.url, self.config.server.url)

    def _stop_server(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._server_thread is not None:
            self._server_thread.join(timeout=5)

    # -- reload --------------------------------------------------------------

    def reload(self) -> None:
        """Load the configuration and patterns again; keep the old ones if the new are bad."""
        notify("RELOADING=1")
        try:
            config = load_config(self.config_path) if self.config_path else self.config
            config = self._with_overrides(config)
            validate(config)
            engine = self._load_engine(config)
        except (ConfigError, PatternError, OSError) as error:
            log.error("reload refused, keeping the running configuration: %s", error)
            notify("READY=1")
            return
        self._stop_pipeline()
        self.config = config
        self._start_alerts()
        # The new sources start from the positions the old ones stored.
        self._start_pipeline(self._build_pipeline(config, engine))
        log.info("reloaded the configuration and %d rules", len(engine.catalog.rules))
        notify("READY=1")

    def _with_overrides(self, config: Config) -> Config:
        return apply_overrides(config, **self.overrides) if self.overrides else config

    # -- main ----------------------------------------------------------------

    def run(self) -> int:
        signal.signal(signal.SIGTERM, lambda *_: self.stopping.set())
        signal.signal(signal.SIGINT, lambda *_: self.stopping.set())
        signal.signal(signal.SIGHUP, lambda *_: self.reload_requested.set())
        horizon_start = time.time() - self.live.horizon
        self.live.restore(self.store.evidence_since(horizon_start), self.store.incidents(limit=10000)[0])
        self._processor.start()
        self._start_alerts()
        self._start_pipeline(self._build_pipeline(self.config, self._load_engine(self.config)))
        self._start_server()
        notify("READY=1")
        notify(f"STATUS=watching {len(self.pipeline.sources) if self.pipeline else 0} source(s)")
        interval = watchdog_interval()
        beat = min(1.0, interval / 2) if interval else 1.0
        try:
            while not self.stopping.wait(beat):
                if self.reload_requested.is_set():
                    self.reload_requested.clear()
                    self.reload()
                if interval and self.all_progressing():
                    notify("WATCHDOG=1")
        finally:
            notify("STOPPING=1")
            log.info("stopping")
            self._stop_pipeline()
            self._finish.set()
            self._processor.join(timeout=30)
            if self.alerts is not None:
                self.alerts.stop()
            self._stop_server()
            self.store.close()
        return 0

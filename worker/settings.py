"""The worker's settings: one frozen object read from ``SGW_*`` variables, every field documented in it (hence long).

Every field is documented where it is declared; ``scorer-worker settings`` prints them all
with secrets masked.
"""

from __future__ import annotations

import json
import os
from typing import Literal
from urllib.parse import urlsplit

import httpx
from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from adapters.stores import keys
from adapters.stores.catalog import CatalogLimits
from scoring.prices import Price, Pricing, parse_prices
from scoring.redact import mask_url
from scoring.webhooks.payloads import LinkTemplate
from scoring.webhooks.retries import RetrySchedule


def room_for(judge_concurrency: int, external_connections: int) -> int:
    """The trace loop's derived room (``Settings.trace_room``)."""
    return max(256, 2 * (judge_concurrency + external_connections))


class Settings(BaseSettings):
    # An invalid value is never quoted back (``str(error)``, a traceback): a model validator's
    # input is every setting given, secrets too, and a short or header-held secret is one no
    # redactor knows.
    model_config = SettingsConfigDict(env_prefix="SGW_", frozen=True, extra="ignore", hide_input_in_errors=True)

    # --- Kafka -------------------------------------------------------------------------------
    kafka_bootstrap: str = Field(
        "127.0.0.1:9092", description="Kafka bootstrap servers, comma-separated host:port."
    )
    # --- Kafka security: every client (the worker's, the API's, the CLI's) connects the same way --
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT", description="How clients talk to the brokers: SASL_SSL for managed Kafka (Confluent Cloud, "
        "MSK, Aiven, Redpanda Cloud), SSL for TLS alone or mTLS.",
    )
    kafka_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = Field(
        None, description="SASL mechanism, required with SASL_PLAINTEXT and SASL_SSL.",
    )
    kafka_sasl_username: str = Field("", description="SASL user name.")
    kafka_sasl_password: SecretStr = Field(SecretStr(""), description="SASL password; never logged.")
    kafka_ssl_ca_file: str = Field(
        "", description="PEM file of the CA that signed the brokers' certificates; empty: the system's CAs.",
    )
    kafka_ssl_cert_file: str = Field("", description="PEM certificate of this client, for mTLS (with the key).")
    kafka_ssl_key_file: str = Field("", description="PEM private key of this client, for mTLS (with the certificate).")
    kafka_ssl_check_hostname: bool = Field(
        True, description="Check that a broker's certificate names the host connected to; keep it on.",
    )
    consumer_group: str = Field(
        "scorer-group-worker",
        description="Kafka consumer group; every worker process in it shares the partitions.",
    )
    traces_topic: str = Field("traces.ingested", description="Topic the ingested traces arrive on.")
    ratings_topic: str = Field(
        "scorer-groups.ratings", description="Topic every group result is published to."
    )
    signals_topic: str = Field(
        "scorer-groups.signals", description="Topic below-threshold Signals are published to."
    )
    webhooks_topic: str = Field(
        "scorer-groups.webhooks", description="Topic of webhook deliveries, one per alert channel."
    )
    labels_topic: str = Field(
        "scorer-groups.labels",
        description="Topic every version of every review label is published to (keyed by item), for the "
                    "team's warehouse: kept in Redis when the reviewer is answered, exported by the workers.",
    )
    webhooks_dlq_topic: str = Field(
        "scorer-groups.webhooks.dlq", description="Dead-letter topic for deliveries that could not be made."
    )
    send_webhooks: bool = Field(
        True, description="Run the webhook sender in this process (POST deliveries to alert channels)."
    )
    webhook_retry_schedule: str = Field(
        "5s,30s,2m,10m,1h,4h,8h",
        description=(
            "Waits between the attempts of a webhook delivery (units ms, s, m, h, d; each spread by "
            "+-20%), kept in Redis across restarts; after the last the delivery is dead-lettered. A "
            "receiver's Retry-After wins, up to the longest wait or an hour."
        ),
    )
    webhook_timeout_s: float = Field(10.0, gt=0, description="Timeout of one webhook attempt.")
    webhook_link_template: str = Field(
        "",
        description=(
            "Link put in alerts (standard: data.link, Slack: a button, PagerDuty: links), with Signal "
            "fields as placeholders, e.g. 'https://app.example.com/groups/{groupId}/ratings/{ratingId}'; "
            "empty: no link."
        ),
    )
    webhook_channel_concurrency: int = Field(
        4, ge=1, description="Attempts at once per alert channel: a slow channel never takes another's."
    )
    webhook_breaker_failures: int = Field(
        5, ge=1,
        description=(
            "Failures in a row that open an alert channel's circuit breaker; it probes again after "
            "SGW_WEBHOOK_BREAKER_OPEN_S, doubling after each failed probe up to 10 minutes."
        ),
    )
    webhook_breaker_open_s: float = Field(30.0, gt=0, description="First pause of an open circuit breaker.")
    webhook_disable_after_s: float = Field(
        86_400.0, gt=0,
        description="An alert channel failing this long without one success is marked disabled (reported).",
    )
    dlq_topic: str = Field(
        "traces.dlq", description="Dead-letter topic for records that cannot be decoded."
    )
    create_topics: bool = Field(
        True,
        description=(
            "Create the topics the worker reads and writes when they are missing (needs the right to "
            "create topics). false: least privilege - the topics must exist, and the worker starts only "
            "once it has checked them, naming any that are missing."
        ),
    )
    topic_partitions: int = Field(
        6, ge=1, description="Partition count used when the worker creates a topic it owns."
    )
    topic_replication_factor: int = Field(
        3, ge=1, description="Replication factor used when the worker creates a topic it owns - at most the "
        "cluster's broker count (a single development broker gets 1). From 3 replicas on, such a topic also gets "
        "min.insync.replicas 2: with acks=all, a write is on two brokers before it counts, and one broker may "
        "be down without stopping writes."
    )
    fetch_min_bytes: int = Field(
        65_536, ge=1,
        description="How much new data (bytes) a fetch of traces waits for on the broker, up to fetch_max_wait_ms: "
        "under light traffic, traces then come in batches instead of one fetch (and one round of Redis, sandbox "
        "and produce calls) each."
    )
    fetch_max_wait_ms: int = Field(
        20, ge=0, le=500,
        description="The longest a fetch of traces waits on the broker for fetch_min_bytes: latency added to a "
        "trace under light traffic, at most."
    )
    event_loop: Literal["uvloop", "asyncio"] = Field(
        "uvloop",
        description="The event loop `scorer-worker run` runs on: uvloop (libuv's, in C: 3-5% less CPU per trace "
        "and per judge call than Python's own, in the benchmark) or asyncio (Python's)."
    )
    producer_linger_ms: int = Field(
        5, ge=0, description="How long the producer waits to fill a batch; trades latency for throughput."
    )
    producer_batch_bytes: int = Field(
        262_144, ge=16_384, description="Largest batch of records per partition the producer sends at once; "
        "ratings are sent in bulk, so larger batches mean fewer produce requests."
    )
    max_trace_bytes: int = Field(
        1_048_576, ge=1024, description="A trace record larger than this goes to the DLQ."
    )
    backfill_estimate_records: int = Field(
        2_000, ge=10, le=1_000_000, description="Records a backfill's dry run reads of its window, at most, "
        "spread over it: the estimate's cost is bounded whatever the window, and its error says how close it is.",
    )
    max_spans_per_trace: int = Field(
        50, ge=1, le=10_000, description="Spans one span-scope group grades in one trace, at most (the first in the "
        "trace's order); those past it are counted in sgw_groups_skipped_total{why=\"span_cap\"}, so a "
        "5,000-span trace cannot take a project's judge budget.",
    )

    # --- Redis -------------------------------------------------------------------------------
    redis_url: str = Field("redis://127.0.0.1:6379/0", description="Redis URL (catalog, budgets).")
    redis_cluster: bool = Field(
        False, description="Redis is a Redis Cluster (or a managed one in cluster mode): SGW_REDIS_URL names any "
        "node (rediss:// and a password as for a single server); the others are discovered.",
    )
    redis_ca_file: str = Field(
        "", description="PEM file of the CA that signed Redis's certificate, for a rediss:// URL; empty: the "
        "system's CAs. A user and password for Redis's ACLs go in the URL (rediss://user:password@host:port/0).",
    )
    redis_timeout_s: float = Field(
        5.0, gt=0,
        description="Socket timeout of Redis calls: a frozen Redis is noticed (and waited for) after this.",
    )
    redis_max_connections: int | None = Field(
        None, ge=8, description="Connections one process keeps to Redis at most (not on a Redis Cluster: its client's "
        "own). A call past them waits for one, up to SGW_REDIS_TIMEOUT_S - back-pressure, not an outage. Default: "
        "what the process drives - 64 for its loops and requests, plus the judge calls and external-scorer "
        "connections it may have in flight.",
    )

    # --- Judges (OpenAI-compatible chat completions) ----------------------------------------
    judge_base_url: str = Field(
        "http://127.0.0.1:8000/v1", description="Base URL of the judge endpoint, ending in /v1."
    )
    judge_api_key: SecretStr = Field(
        SecretStr(""), description="Bearer key for the judge endpoint; never logged."
    )
    judge_model: str = Field("gpt-4o-mini", description="Model asked when a judge names none.")
    judge_timeout_s: float = Field(30.0, gt=0, description="Timeout of one judge HTTP call.")
    judge_prices: str = Field(
        "", description='What each judge model costs, per million tokens, in SGW_CURRENCY: a JSON object '
        '\'{"gpt-4o-mini": {"input": 0.15, "output": 0.6}}\'. A judge call of a model not in it has an unknown '
        "cost (null), never 0; `scorer-worker check` names such models.",
    )
    currency: str = Field("USD", pattern=r"^[A-Z]{3}$", description="The currency of SGW_JUDGE_PRICES and of "
                          "every cost the service shows (ISO 4217: USD, EUR, ...).")
    judge_cache_ttl_s: int = Field(
        7 * 86_400, ge=0, description="How long (at least; at most 4/3 of it) a judge's verdict is kept for the "
        "same judge, model and messages (the verdict cache: paid once). Seven days: a weekly CI run of an unchanged "
        "judge is paid once, and a provider's silent update behind a model's name is asked afresh within 9 1/3 days. "
        "0 turns the cache off.",
    )
    judge_cache_max_entries: int = Field(
        100_000, ge=1, description="Verdicts the cache keeps per project: a quarter of them in each of its time "
        "buckets (a third of the TTL each; a full bucket keeps no more until the next). About 270 bytes each in Redis.",
    )
    judge_token_limit_param: Literal["max_tokens", "max_completion_tokens", "none"] = Field(
        "max_tokens", description="The parameter that bounds a judge's answer: max_completion_tokens for OpenAI's "
        "reasoning models, none for an endpoint that takes neither. A call refused for it is learned per model and "
        "made again (at one more budgeted call); setting it saves that call.",
    )
    judge_response_format: bool = Field(
        True, description="Ask the judge for a JSON object (response_format); false for gateways that refuse it "
        "(learned per model too, as above). The verdict is read from the text either way.",
    )
    judge_extra_headers: SecretStr = Field(
        SecretStr(""), description="More headers for every judge call, as a JSON object "
        '(\'{"X-Gateway-Config": "..."}\'), for gateways that need them; secret: never logged.',
    )
    judge_trace_export: Literal["none", "otlp"] = Field(
        "none", description="Export every judge call of a result as an OpenTelemetry span (GenAI semantic "
        "conventions, linked to the graded trace) to SGW_JUDGE_TRACE_ENDPOINT over OTLP/HTTP: otlp; none: keep "
        "them only with the group's results.",
    )
    judge_trace_endpoint: str = Field(
        "", description="The OTLP/HTTP traces URL judge spans are POSTed to (e.g. "
        "http://otel-collector:4318/v1/traces), for SGW_JUDGE_TRACE_EXPORT=otlp.",
    )
    judge_trace_headers: SecretStr = Field(
        SecretStr(""), description="Headers for the judge span export, as a JSON object (an API key for a "
        "hosted backend); secret: never logged.",
    )
    judge_concurrency: int = Field(
        16, ge=1, description="Concurrent judge calls per endpoint, across all traces."
    )
    judge_concurrency_per_project: int = Field(
        0, ge=0,
        description=(
            "Concurrent judge calls one project may hold; 0 means all but a sixteenth of "
            "SGW_JUDGE_CONCURRENCY (at least one kept back), so another project's first call never "
            "waits for a busy one's. A freed slot goes to the waiting project holding the fewest."
        ),
    )
    external_connections: int = Field(
        64, ge=1, description="Concurrent external-scorer calls (connections), across all projects."
    )
    external_connections_per_project: int = Field(
        0, ge=0,
        description="External-scorer calls one project may hold at once; 0 means all but a sixteenth "
        "of SGW_EXTERNAL_CONNECTIONS (at least one kept back).",
    )

    # --- Egress guard ------------------------------------------------------------------------
    egress_allow: str = Field(
        "",
        description=(
            "Hosts or networks (comma-separated, e.g. '127.0.0.0/8,scorer.internal') that "
            "user-configured URLs may reach although they resolve to a private, loopback, "
            "link-local or metadata address."
        ),
    )

    # --- Processing --------------------------------------------------------------------------
    max_in_flight: int = Field(
        0, ge=0,
        description=(
            "Traces being scored at once; partitions pause when it is full. 0 derives it from what "
            "waits on the network: max(256, 2 x (SGW_JUDGE_CONCURRENCY + SGW_EXTERNAL_CONNECTIONS)), "
            "so the judge concurrency set is the concurrency reached (SGW_MAX_IN_FLIGHT_BYTES bounds "
            "the memory it holds)."
        ),
    )
    max_in_flight_bytes: int = Field(
        256 << 20, ge=1 << 20,
        description="Bytes of trace records being scored at once; partitions pause past it, whatever "
        "the count (a room of large traces holds this much memory at most, beside their scoring).",
    )
    commit_interval_s: float = Field(
        1.0, gt=0, description="How often finished offsets are committed."
    )
    shutdown_timeout_s: float = Field(
        20.0, gt=0, description="On SIGTERM, how long in-flight work may take to finish."
    )

    outage_tolerance_s: float = Field(
        120.0, gt=0, le=keys.ONCE_TTL_S / 2,
        description=(
            "How long Redis or the broker may stay unreachable while the worker waits in-process "
            "(not fetching, in-flight work parked, /readyz false with the reason); past it the "
            "worker exits 1 and uncommitted work is redelivered. At most 450 s: a batch's writes "
            "replayed after an outage are recognised (and added once) for 900 s."
        ),
    )
    claim_lease_s: float = Field(
        180.0, gt=0,
        description=(
            "How long a (group, trace) claim is held while it is scored. Another worker waits on a "
            "live lease; an expired one (its worker died) is scored again. Keep it above the longest "
            "scoring time (judge timeout × retries)."
        ),
    )
    session_sweep_interval_s: float = Field(
        2.0, gt=0, description="How often quiet sessions are looked for (session-scope groups)."
    )
    incident_interval_s: float = Field(
        10.0, gt=0, le=3600, description="How often groups that alert on windows, drift or coverage are looked at."
    )
    fleet_lease_s: float = Field(
        15.0, ge=1, le=600, description="How long a worker holds its share of the fleet's background work (incident "
        "watches, digests, the session sweep: 64 shards of groups and projects) without renewing it; renewed every "
        "third of it. A worker that dies hands its share over within it; one that joins gets its share within a "
        "third of it.",
    )
    no_score_alert_interval_s: int = Field(
        3600, ge=1, description="At most one no-score Signal per group in this many seconds: a group whose "
        "results start having no score (a must-pass member cannot score) raises one, not one per result."
    )
    member_deadline_s: float = Field(
        120.0, gt=0,
        description=(
            "The most one member may take, waits for a judge slot or a sandbox included; past it the "
            "member could not score. Must stay below SGW_CLAIM_LEASE_S."
        ),
    )
    code_sandboxes: int = Field(2, ge=1, description="Sandboxed processes that run code scorers.")
    code_sandboxes_per_project: int = Field(
        0, ge=0,
        description="Sandboxed processes one project may hold at once; 0 means half the pool (at least 1).",
    )
    code_sandbox: Literal["bwrap", "unsafe-none"] = Field(
        "bwrap",
        description=(
            "How code scorers are confined: 'bwrap' (bubblewrap: own uid, user/pid/net/mount namespaces, "
            "seccomp; if it cannot be set up, code scorers do not run) or 'unsafe-none' (no isolation: "
            "only for a single trusted tenant; warned about at every start)."
        ),
    )
    sandbox_python: str = Field(
        "/usr/bin/python3",
        description="Python that runs code scorers inside the sandbox (needs libseccomp's Python binding).",
    )
    sandbox_uid: int = Field(
        65534, ge=1,
        description="Unprivileged uid (and gid) the sandbox runs as when the worker runs as root.",
    )
    code_memory_mb: int = Field(256, ge=32, description="Address-space limit of one code-scorer sandbox.")

    # --- OpenTelemetry in (the Collector's Kafka exporter) ---------------------------------------
    otlp_enabled: bool = Field(
        False, description="Consume SGW_OTLP_TOPIC, assemble OpenTelemetry spans into traces and score them."
    )
    otlp_topic: str = Field("otlp_spans", description="Topic the Collector's Kafka exporter writes spans to.")
    otlp_encoding: Literal["auto", "otlp_proto", "otlp_json"] = Field(
        "auto", description="The exporter's encoding; 'auto' reads both (JSON starts with '{')."
    )
    otlp_project_attribute: str = Field(
        "sgw.project.id", description="Resource (else span) attribute naming a span's project."
    )
    otlp_default_project: str = Field(
        "", description="Project of spans that name none; empty: such spans are dead-lettered (no_project)."
    )
    otlp_session_attribute: str = Field(
        "", description="Attribute read as the session id after gen_ai.conversation.id and session.id."
    )
    otlp_quiet_s: float = Field(
        5.0, gt=0, description="A trace is assembled once its root span arrived and no span came for this long."
    )
    otlp_max_wait_s: float = Field(
        300.0, gt=0, description="A trace is assembled this long after its first span at the latest (partial)."
    )
    otlp_max_spans_per_trace: int = Field(
        1000, ge=1, description="Spans buffered per trace; further spans are dropped and the trace marked partial."
    )
    otlp_max_buffer_bytes: int = Field(
        256 << 20, ge=1 << 16, description="Bytes buffered over all traces; past it span intake pauses."
    )
    otlp_max_project_bytes: int = Field(
        64 << 20, ge=1 << 14,
        description="Bytes one project may hold in the assembly buffer; past it its records are dead-lettered "
                    "(over_quota), so one tenant cannot stall the others.",
    )
    otlp_buffer_ttl_s: float = Field(
        6 * 3600.0, gt=0, description="How long buffered spans live in Redis with no worker to assemble them."
    )
    otlp_late_window_s: int = Field(
        6 * 3600, ge=1, description="How long an emitted trace is remembered, so late spans are counted, not re-scored."
    )
    otlp_claim_lease_s: float = Field(
        30.0, gt=0, description="How long a worker holds a due trace while publishing it; then another may."
    )
    otlp_flush_interval_s: float = Field(0.5, gt=0, description="How often due traces are looked for.")

    # --- Operations --------------------------------------------------------------------------
    metrics_port: int = Field(
        9108, ge=0, le=65535,
        description="Port of /metrics, /healthz and /readyz; 0 picks a free port and logs it.",
    )
    api_port: int = Field(
        8080, ge=0, le=65535,
        description="Port of `scorer-worker api` (the HTTP API); 0 picks a free port and logs it.",
    )
    api_host: str = Field("0.0.0.0", description="Address `scorer-worker api` listens on.")
    api_max_body_bytes: int = Field(
        64 * 1024 * 1024, ge=1024,
        description="Largest request body the API reads on any route (413 past it); each route has a "
        "ceiling of its own below it (512 KiB for catalog documents, ~3.4 MiB for the playground, "
        "64 MiB for a dataset upload: a file is at most 32 MiB).",
    )
    api_body_parsers: int = Field(
        1, ge=1, le=16, description="Processes that validate large request bodies (over 64 KiB) off the event loop.",
    )
    api_body_readers: int = Field(
        4, ge=1, le=64,
        description="Large request bodies (over 64 KiB) read and validated at once, shared fairly across projects "
        "(one project holds at most all but one); the rest wait their turn, unread.",
    )
    api_body_read_timeout_s: float = Field(
        60.0, gt=0, description="How long a large request body may take to arrive once its turn comes (408 past it).",
    )
    judge_max_examples: int = Field(
        8, ge=0, le=32, description="Graded examples a judge may keep in its prompt (POST /v1/judges/{id}/examples "
                                    "past it: 409); each is part of the judge's rubric.",
    )
    max_datasets_per_project: int = Field(
        100, ge=0, description="Datasets a project may keep; creating one more is refused (409, naming this quota).",
    )
    max_evaluation_runs_per_project: int = Field(
        1_000, ge=0, description="Evaluation runs a project may keep (a run is kept 90 days after its last change); "
        "creating one more is refused (409, naming this quota).",
    )
    max_alignment_runs_per_project: int = Field(
        100, ge=0, description="Alignment runs a project may keep (a run is kept 90 days after its last change); "
        "starting one more is refused (409, naming this quota).",
    )
    max_project_stored_bytes: int = Field(
        2 * 1024**3, ge=0, description="Bytes a project may keep in datasets (every version's rows), evaluation "
        "runs (results and judge calls) and alignment runs together; a dataset, version or run created past it is "
        "refused (409, naming this quota). A finalize is never refused: its bytes count from then on.",
    )
    max_project_review_items: int = Field(
        1_000_000, ge=0, description="Review items a project's queues may keep together (each keeps up to 10 x its "
        "capacity, open or labelled); a queue saved past it is refused (409, naming this quota).",
    )
    max_project_review_bytes: int = Field(
        2 * 1024**3, ge=0, description="Bytes of review items a project's queues may keep together (the sum of their "
        "maxBytes; each queue turns results away past its own); a queue saved past it is refused (409, naming this "
        "quota).",
    )
    catalog_max_docs_per_project: int = Field(
        1_000, ge=1, description="Catalog documents of one kind (groups, judges, patterns, custom evaluators, alert "
        "channels) a project may keep through the API; creating one more is refused (409, naming this quota). The "
        "operators' `catalog apply` is not bounded by it.",
    )
    log_format: Literal["json", "console"] = Field(
        "json", description="'json' lines for production, 'console' for people."
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="Lowest level that is logged."
    )

    @model_validator(mode="after")
    def _kafka_security_is_complete(self) -> Settings:
        sasl = self.kafka_security_protocol.startswith("SASL_")
        if sasl and (self.kafka_sasl_mechanism is None or not self.kafka_sasl_username
                     or not self.kafka_sasl_password.get_secret_value()):
            raise ValueError(f"SGW_KAFKA_SECURITY_PROTOCOL={self.kafka_security_protocol} needs "
                             "SGW_KAFKA_SASL_MECHANISM, SGW_KAFKA_SASL_USERNAME and SGW_KAFKA_SASL_PASSWORD")
        if not sasl and (self.kafka_sasl_mechanism or self.kafka_sasl_username):
            raise ValueError(f"SGW_KAFKA_SASL_*: set, but SGW_KAFKA_SECURITY_PROTOCOL is "
                             f"{self.kafka_security_protocol} (SASL_SSL or SASL_PLAINTEXT use them)")
        if bool(self.kafka_ssl_cert_file) != bool(self.kafka_ssl_key_file):
            raise ValueError("SGW_KAFKA_SSL_CERT_FILE and SGW_KAFKA_SSL_KEY_FILE go together (mTLS)")
        tls = self.kafka_security_protocol in ("SSL", "SASL_SSL")
        for name in ("kafka_ssl_ca_file", "kafka_ssl_cert_file", "kafka_ssl_key_file"):
            path = getattr(self, name)
            if path and not tls:
                raise ValueError(f"SGW_{name.upper()}: set, but SGW_KAFKA_SECURITY_PROTOCOL is "
                                 f"{self.kafka_security_protocol} (SSL or SASL_SSL use it)")
            if path and not os.path.isfile(path):
                raise ValueError(f"SGW_{name.upper()}: no file at {path}")
        return self

    def judge_headers(self) -> dict[str, str]:
        raw = self.judge_extra_headers.get_secret_value()
        return json.loads(raw) if raw else {}

    def judge_trace_export_headers(self) -> dict[str, str]:
        raw = self.judge_trace_headers.get_secret_value()
        return json.loads(raw) if raw else {}

    @model_validator(mode="after")
    def _judge_trace_export_has_an_endpoint(self) -> Settings:
        if self.judge_trace_export == "otlp" and not _is_http_url(self.judge_trace_endpoint):
            raise ValueError("SGW_JUDGE_TRACE_EXPORT=otlp needs SGW_JUDGE_TRACE_ENDPOINT, an http(s) URL such as "
                             "http://otel-collector:4318/v1/traces")
        return self

    @field_validator("judge_extra_headers", "judge_trace_headers")
    @classmethod
    def _headers_are_an_object_of_strings(cls, value: SecretStr) -> SecretStr:
        raw = value.get_secret_value()
        if raw:
            try:
                parsed = json.loads(raw)
            except ValueError:
                parsed = None
            if not (isinstance(parsed, dict) and all(isinstance(k, str) and isinstance(v, str)
                                                     for k, v in parsed.items())):
                raise ValueError('must be a JSON object of header names to string values, e.g. {"X-Key": "v"}')
            if not all(k.isascii() and v.isascii() and k.isprintable() and v.isprintable() for k, v in parsed.items()):
                raise ValueError("header names and values must be printable ASCII (HTTP sends them so)")
        return value

    @model_validator(mode="after")
    def _redis_tls_is_complete(self) -> Settings:
        if self.redis_ca_file and not self.redis_url.startswith("rediss://"):
            raise ValueError("SGW_REDIS_CA_FILE: set, but SGW_REDIS_URL is not a rediss:// (TLS) URL")
        if self.redis_ca_file and not os.path.isfile(self.redis_ca_file):
            raise ValueError(f"SGW_REDIS_CA_FILE: no file at {self.redis_ca_file}")
        return self

    @model_validator(mode="after")
    def _lease_outlives_scoring(self) -> Settings:
        if self.claim_lease_s <= self.member_deadline_s:
            raise ValueError(
                f"SGW_CLAIM_LEASE_S ({self.claim_lease_s:g}) must exceed SGW_MEMBER_DEADLINE_S "
                f"({self.member_deadline_s:g}): a lease that expires while its pair is still scored "
                "lets another worker score it (and spend budget) again"
            )
        return self

    @field_validator("judge_prices")
    @classmethod
    def _prices_parse(cls, value: str) -> str:
        parse_prices(value)  # its error names SGW_JUDGE_PRICES and the model, never the value
        return value

    def prices(self) -> dict[str, Price]:
        return parse_prices(self.judge_prices)

    def redis_connections(self) -> int:
        """``SGW_REDIS_MAX_CONNECTIONS``, or what the process drives: each judge call and external
        scorer's pair may hold one (its claim, its settlement), the loops and API requests the rest."""
        return self.redis_max_connections or 64 + self.judge_concurrency + self.external_connections

    def catalog_limits(self) -> CatalogLimits:
        """What a project's documents may hold, as the API checks them on every write."""
        return CatalogLimits(docs_per_kind=self.catalog_max_docs_per_project, judge_examples=self.judge_max_examples,
                             review_items=self.max_project_review_items, review_bytes=self.max_project_review_bytes)

    def pricing(self) -> Pricing:
        """The price table and the model a judge without its own calls."""
        return Pricing(self.prices(), self.judge_model)

    @field_validator("webhook_retry_schedule")
    @classmethod
    def _retry_schedule_parses(cls, value: str) -> str:
        RetrySchedule.parse(value)
        return value

    @field_validator("webhook_link_template")
    @classmethod
    def _link_template_names_signal_fields(cls, value: str) -> str:
        LinkTemplate(value)
        return value

    def trace_room(self) -> int:
        """Traces the loop holds at once. Pairs that wait on a judge or an external scorer cost
        memory, not CPU: the room must hold every slot's worth of them, plus as many again for
        what is being decoded, claimed, published and marked done meanwhile - or the slots an
        operator sets are never all in use (measured: 256 judge slots reached 0.56 of their
        rate in a room of 256)."""
        return self.max_in_flight or room_for(self.judge_concurrency, self.external_connections)

    def webhook_retry(self) -> RetrySchedule:
        return RetrySchedule.parse(self.webhook_retry_schedule)

    def egress_allow_list(self) -> list[str]:
        return [item.strip() for item in self.egress_allow.split(",") if item.strip()]

    def secrets(self) -> list[str]:
        """Every secret value the settings hold (secret fields, passwords inside URLs), so that
        they can be cut from whatever the process publishes or logs."""
        found = []
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, SecretStr):
                found.append(value.get_secret_value())
                if name == "judge_extra_headers":  # each header's value too, wherever it shows alone
                    found += list(self.judge_headers().values())
                elif name == "judge_trace_headers":
                    found += list(self.judge_trace_export_headers().values())
            elif isinstance(value, str) and "://" in value:
                found += _url_secrets(value)
        return [s for s in found if s]

    def described(self) -> list[tuple[str, str, str]]:
        """(environment variable, value with secrets masked, description) for each field."""
        rows = []
        for name, field in type(self).model_fields.items():
            value = getattr(self, name)
            if isinstance(value, SecretStr):
                shown = "**********" if value else ""
            elif isinstance(value, str) and "://" in value:
                shown = ",".join(mask_url(part) for part in value.split(","))
            else:
                shown = str(value)
            rows.append((f"SGW_{name.upper()}", shown, field.description or ""))
        return rows


def _url_secrets(value: str) -> list[str]:
    """Passwords and user names-as-tokens inside the URLs of a (comma-separated) setting."""
    found = []
    for part in value.split(","):
        try:
            parts = urlsplit(part.strip())
        except ValueError:
            continue
        found += [p for p in (parts.password, parts.username if parts.password is None else None) if p]
    return found


def _is_http_url(url: str) -> bool:
    """An http(s) URL httpx can send to (``http://[::1/x`` starts like one, and is not)."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError):
        return False
    return parsed.scheme in ("http", "https") and bool(parsed.host)

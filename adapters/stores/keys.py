"""Every Redis key, channel and TTL the worker uses, with why: one module by design, the hash tags chosen together.

The one rule: keys that one Lua script, pipeline or transaction touches together share a hash tag, so the
same code runs on Redis Cluster, and no tag is shared by every tenant's hot path; every key that grows with
traffic has a TTL. The tags: docs/design-notes.md.
"""

from __future__ import annotations

import hashlib
import zlib

PREFIX = "sgw"

# --- The fleet's share of background work (adapters.stores.shards) -------------------------
# Incident watches, digests and the session sweep are split across the running workers by
# SHARDS leases (a group's or project's shard: shard_of), as Kafka hands out partitions. One tag:
# each worker's renewal is one script over the members and the leases.
FLEET_TAG = "{fleet}"
FLEET_MEMBERS = f"{PREFIX}:{FLEET_TAG}:members"  # sorted set: worker -> the end of its lease (ms)
FLEET_LEASES = f"{PREFIX}:{FLEET_TAG}:leases"  # hash: shard -> "<worker> <lease end, ms>"
SHARDS = 64  # more than a fleet's workers, few enough to renew in one call


def shard_of(key: str) -> int:
    """The shard of a group or project id (crc32: the same in every process and release)."""
    return zlib.crc32(key.encode()) % SHARDS


# --- Exactly once: a batch's writes that add (counters, money) are counted once ----------------
# A script that adds records its batch's id in the same step (SET NX of a key under the tag of
# what it adds to), and adds nothing when the id is there: the outage guard's replay of a batch
# whose pipeline had partly run (a connection lost after some scripts ran) adds the rest only.
# Kept long enough to outlast any replay: the outage guard gives up (and the process exits, its
# traces redelivered as new batches) after SGW_OUTAGE_TOLERANCE_S, 120 s by default and at most
# half of this (the setting refuses more).
ONCE_TTL_S = 900


def once(tag: str, batch: str) -> str:
    return f"{PREFIX}:once:{{{tag}}}:{batch}"


# --- Catalog: a handful of small documents, changed by people, read by every worker --------
CATALOG_TAG = "{catalog}"
# Bumped by every catalog write; workers compare it to know whether their snapshot is stale,
# and every write WATCHes it, so concurrent writers serialize instead of losing updates.
CATALOG_VERSION = f"{PREFIX}:{CATALOG_TAG}:version"
# One hash per kind of document: field = document id, value = {"v": version, "doc": {...}}.
CATALOG_KINDS = ("judges", "patterns", "customs", "groups", "budgets", "channels", "queues")
# Published (with the new version) after every write: running workers reload within a second.
CATALOG_CHANNEL = f"{PREFIX}:catalog:changed"
# What each version changed ({"v": version, "docs": [[kind, id], ...]}), newest first,
# written in the same transaction as the documents and the version: a reader behind by fewer
# than CATALOG_LOG_KEPT versions reads only the changed documents (a delta), else all of them.
CATALOG_LOG = f"{PREFIX}:{CATALOG_TAG}:log"
CATALOG_LOG_KEPT = 1000


# The catalog's write turn across processes (``adapters.stores.catalog_turn``): the process
# writing now (a string with a lease: a writer that dies leaves it within CATALOG_TURN_LEASE_MS),
# and the processes waiting for it, by arrival (a sorted set) and by when each last asked (one
# that stopped asking for CATALOG_TURN_GONE_MS left, and loses its place).
CATALOG_TURN = f"{PREFIX}:{CATALOG_TAG}:turn"
CATALOG_TURN_QUEUE = f"{PREFIX}:{CATALOG_TAG}:turn-queue"
CATALOG_TURN_SEEN = f"{PREFIX}:{CATALOG_TAG}:turn-seen"
CATALOG_TURN_LEASE_MS = 5_000  # a write takes milliseconds; the WATCH keeps one past it correct
CATALOG_TURN_GONE_MS = 2_000


def catalog_hash(kind: str) -> str:
    return f"{PREFIX}:{CATALOG_TAG}:{kind}"


# --- Ratings history: buckets per group, one series per chart window ------------------------
# window name -> (window seconds, bucket seconds). Bucket counts stay between 60 and 168, so a
# chart reads a bounded number of small hashes whatever the traffic.
RATING_WINDOWS: dict[str, tuple[int, int]] = {
    "1h": (3_600, 60),
    "24h": (86_400, 900),
    "7d": (7 * 86_400, 3_600),
    "30d": (30 * 86_400, 6 * 3_600),
}


# A group's latest results, newest first: a list trimmed to exactly RESULTS_KEPT (the console's
# and the API's "recent results"). A list, not a stream: a batch of results is one LPUSH, not an
# XADD each. Each item is "<seq>:<below 0|1>:<the published rating's JSON>"; ``seq`` counts up
# from the newest item's, so a page's cursor (a seq) still finds its place after newer pushes.
# It expires a month after the group's last result. (Before this list, the results were a
# stream under ``results:{group}``: left to expire.)
RESULTS_KEPT = 1_000
RESULTS_TTL_S = 30 * 86_400
# The index below is trimmed when a push carries the seq past a multiple of this, not at every
# push: three commands per group and batch saved, for at most this many entries more than the
# list, each no longer found (its result is gone: ``RatingsStore.result`` checks the list).
RESULTS_INDEX_TRIM_EVERY = 64


def group_results(group_id: str) -> str:
    return f"{PREFIX}:latest:{{{group_id}}}"


# Which groups had traffic, and when last: a sorted set per fleet shard (group -> epoch seconds
# of its last result or count, live traffic's), written with the history. The fleet's background
# work (incident watches, digests) reads its shards' recent members instead of walking every
# group of the catalog: idle groups cost nothing. Members older than ACTIVE_KEPT_S are trimmed by
# those reads (longer than any alert window or digest period: a day); no TTL - a set holds at
# most the catalog's groups, and a TTL would cost every write a command.
ACTIVE_KEPT_S = 3 * 86_400


def active_groups(shard: int) -> str:
    return f"{PREFIX}:active:{{{shard}}}"


def group_results_seqs(group_id: str) -> str:
    """Rating id -> its place (seq) in the list above: finds one result. Trimmed by seq with the
    list, by the script that trims it (every RESULTS_INDEX_TRIM_EVERY seqs)."""
    return f"{PREFIX}:latest-seqs:{{{group_id}}}"


def group_judge_calls(group_id: str) -> str:
    """Rating id -> the judge calls behind it (scoring.judge_calls), for the results the list
    keeps: trimmed with ``group_results_seqs``."""
    return f"{PREFIX}:judge-calls:{{{group_id}}}"


def rating_bucket_past(group_id: str, bucket_s: int, bucket_start: int) -> str:
    """The part of a bucket counted at its subjects' own time (backfills): the chart shows the
    whole bucket; the incident watcher, the bucket less this part."""
    return rating_bucket(group_id, bucket_s, bucket_start) + ":past"


def rating_bucket(group_id: str, bucket_s: int, bucket_start: int) -> str:
    # A bucket lives as long as the window it belongs to, plus one bucket: then it has left
    # every chart that could show it (TTL set by the script that writes it).
    return f"{PREFIX}:ratings:{{{group_id}}}:{bucket_s}:{bucket_start}"


# The latest verdict per group for a session (sessions.scores): kept 30 days after the last one.
SESSION_SCORES_TTL_S = 30 * 86_400


def session_scores(session_id: str) -> str:
    return f"{PREFIX}:session-scores:{{{session_id}}}"


# --- Sessions: the turns of conversations that session-scope groups will judge --------------
# A session's turns (field = traceId, so a redelivered trace is stored once), kept a week after
# its last turn; at most SESSION_MAX_TURNS are stored.
SESSION_TURNS_TTL_S = 7 * 86_400
SESSION_MAX_TURNS = 500


def session_turns(project_id: str, session_id: str) -> str:
    return f"{PREFIX}:session-turns:{{{project_id}}}:{session_id}"


# Per project: session id -> when its last turn arrived. The sweeper reads the quiet ones; a
# session leaves the index once it has been quiet past every group's idle time and was judged.
def session_activity(project_id: str) -> str:
    return f"{PREFIX}:session-activity:{{{project_id}}}"


# Fleet-wide: the projects with conversations open (project -> its count of turn batches), kept
# as turns arrive, so the sweep reads only those - an idle fleet reads no project's sessions. A
# project leaves once its activity index is empty (and no turn came since).
SESSIONS_OPEN = f"{PREFIX}:sessions:open"


# --- Live scoring: budgets and dedupe, per project --------------------------------------------
# The online judge-call budget is shared with online evaluators: the same key for both.
def judge_budget(project_id: str, window_start: int) -> str:
    return f"online-judge-budget:{{{project_id}}}:{window_start}"


# Judge tokens of the same window: what a token budget reserves (a ceiling per call) and what
# settles it (the usage the judge API reported), so it reads the tokens used once calls end. The
# same hash tag as the calls: one script updates both on Redis Cluster.
def judge_tokens(project_id: str, window_start: int) -> str:
    return f"online-judge-tokens:{{{project_id}}}:{window_start}"


# Money of the same window, in whole nanos of the currency: what a money cap
# reserves (the cost of a call's token ceiling at its model's price) and what settles it (what
# the call cost); kept only under a cap, as tokens are.
def judge_cost(project_id: str, window_start: int) -> str:
    return f"online-judge-cost:{{{project_id}}}:{window_start}"


# A group's money of a day (UTC), under its ``online.maxCostPerDay``: one rubric cannot eat its
# project's budget. The project's hash tag: the claim script updates it with the project's keys.
def judge_group_cost(project_id: str, group_id: str, day: int) -> str:
    return f"online-judge-group-cost:{{{project_id}}}:{group_id}:{day}"


GROUP_COST_TTL_S = 2 * 86_400  # a day's, read through that day


# What the verdict cache saved a project in a budget window (hash: calls, tokens): shown beside
# what the window used (GET /v1/budgets/{projectId}).
def judge_saved(project_id: str, window_start: int) -> str:
    return f"online-judge-saved:{{{project_id}}}:{window_start}"


# The verdict cache (scoring.verdict_cache): a judge's verdict on the exact messages of a call,
# paid once - a hash per project and time bucket (a third of SGW_JUDGE_CACHE_TTL_S), field = the
# verdict's key. The project's tag: the claim's script reads them beside the budget and the
# claims. A bucket expires once no lookup reads it (scoring.verdict_cache.CachePolicy).
def judge_verdicts(project_id: str, bucket: int) -> str:
    return f"{PREFIX}:verdicts:{{{project_id}}}:{bucket}"


# (group, subject) claims: "lease:<expiresAtMs>:<owner>" while being scored, "done:<ratingId>"
# once its outputs are acknowledged, "skipped:budget" when the budget was short. One hash per
# project and day of the subject (a trace's own timestamp, a session's first turn), field
# "<groupId>:<subjectKey>": a batch reads and writes its pairs with one command per hash instead
# of one key per pair. A hash expires this long after its last write, so a done mark outlives any
# redelivery.
DEDUPE_DONE_TTL_S = 7 * 86_400


def dedupe_claims(project_id: str, day: int) -> str:
    """The claims of a project's subjects of one day (days since 1970-01-01, UTC)."""
    return f"{PREFIX}:claims:{{{project_id}}}:{day}"


def dedupe_field(group_id: str, subject_key: str) -> str:
    return f"{group_id}:{subject_key}"


# --- No-score alerts: at most one Signal per group and interval while results lack a score ---
# The value is the id of the Signal that claimed the interval (so a redelivered result raises the
# same Signal again, never a second one); the TTL is the interval. The project's tag: one
# script call claims a batch's groups of one project.
def no_score_alert(project_id: str, group_id: str) -> str:
    return f"{PREFIX}:{{{project_id}}}:no-score-alert:{group_id}"


# --- Webhook deliveries: the durable retry schedule (adapters/stores/deliveries.py) ------------
# Sharded by channel: a shard is a hash tag of its own, holding the due and created sets of the
# deliveries of its channels and each one's keys, so a script touches one shard's keys - and on
# Redis Cluster the shards spread delivery load over the primaries (one tag for all of them put
# it on one node). By channel, not by delivery: a PagerDuty incident is opened by one delivery
# and closed by another, and the script that checks it writes the delivery in the same slot.
# 16 shards: several per primary of a usual cluster; a poll reads each once per round trip.
WEBHOOK_SHARDS = 16
# Every delivery not yet finished, scored by when it is due (ms); and by when it was first seen.
# Both shrink as deliveries finish, and expire with the last pending document.
# A pending delivery lives as long as its whole schedule could take, plus this.
WEBHOOK_PENDING_SLACK_S = 86_400
# A finished delivery's outcome, so a redelivered record is not sent again.
WEBHOOK_DONE_TTL_S = 7 * 86_400
# An incident a PagerDuty channel was sent (trigger) and not yet resolved, per channel and
# Signal key: a recovery is sent only where one is open. Forgotten after 30 days.
WEBHOOK_INCIDENT_TTL_S = 30 * 86_400


def webhook_shard(channel: str) -> int:
    """The shard of a channel (its key, ``channel_key(url)``): stable across processes."""
    return zlib.crc32(channel.encode()) % WEBHOOK_SHARDS


def _webhooks(shard: int) -> str:
    return f"{PREFIX}:webhooks:{{webhooks:{shard}}}"


def webhook_due(shard: int) -> str:
    return f"{_webhooks(shard)}:due"


def webhook_created(shard: int) -> str:
    return f"{_webhooks(shard)}:created"


def webhook_pending(shard: int, delivery_id: str) -> str:
    return f"{_webhooks(shard)}:pending:{delivery_id}"


def webhook_done(shard: int, delivery_id: str) -> str:
    return f"{_webhooks(shard)}:done:{delivery_id}"


def webhook_incident(shard: int, channel_hash: str, signal_key: str) -> str:
    return f"{_webhooks(shard)}:incident:{channel_hash}:{signal_key}"


# --- The API: keys and the change log -----------------------------------------------------------
# API keys: one hash, field = key id, value = JSON with the SHA-256 of the key (never the key),
# its project (null for an operator key), name, and when it was created and revoked. A few per
# project, never growing with traffic; revoked keys stay listed.
API_KEYS = f"{PREFIX}:api-keys"

# Every catalog write, newest first, per document: who, when, what changed. In the catalog's hash
# tag, so the entry is written in the same transaction as the change. Bounded per document.
CHANGES_KEPT = 1_000


def catalog_changes(kind: str, doc_id: str) -> str:
    return f"{PREFIX}:{CATALOG_TAG}:changes:{kind}:{doc_id}"


# --- Datasets and evaluation runs, per project (adapters/stores/datasets.py, adapters/stores/evaluations.py) ----
# A project's datasets: one hash, field = dataset id, value = the dataset's JSON (name, latest
# version, row counts). Each version's rows are one immutable JSON string, so a run reads the
# version it recorded even after newer ones are added. Kept until deleted: they are the tenant's.
def datasets(project_id: str) -> str:
    return f"{PREFIX}:datasets:{{{project_id}}}"


def dataset_rows(project_id: str, dataset_id: str, version: int) -> str:
    return f"{PREFIX}:dataset-rows:{{{project_id}}}:{dataset_id}:{version}"


# The bytes of every version's rows of the project's datasets (a counter, added to as versions
# are written; counted once from the versions when missing): what the stored-bytes quota counts.
def dataset_bytes(project_id: str) -> str:
    return f"{PREFIX}:dataset-bytes:{{{project_id}}}"


# An evaluation run (its request, outputs and row results) is one JSON string kept
# EVALUATION_TTL_S after its last change, so a failed CI gate can be inspected later; the
# project's index of runs (a sorted set by creation time) drops ids whose run has expired.
EVALUATION_TTL_S = 90 * 86_400


def evaluation(project_id: str, run_id: str) -> str:
    return f"{PREFIX}:evaluation:{{{project_id}}}:{run_id}"


# A judge's alignment runs (a candidate against the current judge on held-out labels):
# each one JSON string, and the judge's index of them (a sorted set by creation time), kept
# ALIGNMENT_TTL_S after the last change - the figures a promotion was decided on stay readable
# for as long as an evaluation run's.
ALIGNMENT_TTL_S = 90 * 86_400


def alignment(judge_id: str, alignment_id: str) -> str:
    return f"{PREFIX}:alignment:{{{judge_id}}}:{alignment_id}"


def alignments(judge_id: str) -> str:
    return f"{PREFIX}:alignments:{{{judge_id}}}"


# An alignment run is a job any API process may grade (``worker.alignment_runner``): the runs not
# ended, fleet-wide (a hash: run id -> "<project> <judge>"; a project has at most one), and per
# run what it grades (its judges as they were and its cases, JSON; gone when the run ends), the
# verdicts it has (a hash: "<judge role>:<case id>" -> rating, "" when none), and the lease of
# the process grading it (renewed with each save: a process that died leaves it within
# ALIGNMENT_LEASE_MS, and another resumes the run where its verdicts end).
ALIGNMENTS_ACTIVE = f"{PREFIX}:alignments:active"
ALIGNMENT_LEASE_MS = 15_000


def alignment_work(judge_id: str, alignment_id: str) -> str:
    return f"{PREFIX}:alignment:{{{judge_id}}}:{alignment_id}:work"


def alignment_verdicts(judge_id: str, alignment_id: str) -> str:
    return f"{PREFIX}:alignment:{{{judge_id}}}:{alignment_id}:verdicts"


def alignment_lease(judge_id: str, alignment_id: str) -> str:
    return f"{PREFIX}:alignment:{{{judge_id}}}:{alignment_id}:lease"


# A project's storage ledger (adapters.stores.quotas): what its quotas count beside its datasets
# and runs - alignment runs for as long as they are kept, and reservations of creates in flight
# (field = token, value = "<kind> <expires at> <bytes>"); one script counts and adds, so two
# creates at once never both take the last place. Entries past their time are dropped as read.
def project_storage(project_id: str) -> str:
    return f"{PREFIX}:storage:{{{project_id}}}"


# A project's traffic index: its records on the traces topic by hour of their timestamp (field =
# hours since the epoch, value = records), counted by the live loop as it reads them. What a
# backfill's estimate scales by: the tenant's own traffic, never the shared topic's volume (which
# would tell it other tenants'). Kept as long as a topic's retention usually is.
TRAFFIC_TTL_S = 35 * 86_400
TRAFFIC_BUCKET_MS = 3_600_000  # an hour


def traffic(project_id: str) -> str:
    return f"{PREFIX}:traffic:{{{project_id}}}"


def evaluations(project_id: str) -> str:
    return f"{PREFIX}:evaluations:{{{project_id}}}"


# Beside each run, what reads of many runs or of one row need, so they never read a run whole:
# the project's hash of run summaries (field = run id, value = the run without rows and judge
# columns, as lists show it); its hash of sizes (field = run id, value = "<expires at> <bytes>":
# what the quotas count, and how a list knows a run has expired); and per run one character per
# row (what the row is: adapters.stores.evaluations.row_kinds), kept as long as the run.
def evaluation_summaries(project_id: str) -> str:
    return f"{PREFIX}:evaluation-summaries:{{{project_id}}}"


def evaluation_sizes(project_id: str) -> str:
    return f"{PREFIX}:evaluation-sizes:{{{project_id}}}"


def evaluation_rows(project_id: str, run_id: str) -> str:
    return f"{PREFIX}:evaluation-rows:{{{project_id}}}:{run_id}"


# A run's judge calls: one hash, field = row index, value = the row's calls as a live result
# keeps them (scoring.judge_calls.encode_calls), written with the run and kept as long. At most
# EVALUATION_CALLS_BYTES a run - 10,000 rows of a judge panel would otherwise be 300 MB - the
# unscored and lowest-rated rows first: the ones a failed gate sends people to read.
EVALUATION_CALLS_BYTES = 16 * 1024 * 1024


def evaluation_calls(project_id: str, run_id: str) -> str:
    return f"{PREFIX}:evaluation-calls:{{{project_id}}}:{run_id}"


# --- Backfills (adapters.stores.backfills): a job's keys, a group's jobs, the jobs not ended ------
# A job's own keys share its id as hash tag: its document, state, ranges, plan lock and leases are
# on one Redis Cluster node, so a batch's offset and counts move in one transaction.

BACKFILLS_ACTIVE = f"{PREFIX}:backfills:active"


def project_backfills(project_id: str) -> str:
    """A project's jobs not ended, each by when it took its place (a sorted set, the project's
    tag): the cap (``MAX_ACTIVE_JOBS``) is checked and a place taken in one script."""
    return f"{PREFIX}:backfills:project:{{{project_id}}}"


def backfill(job_id: str) -> str:
    return f"{PREFIX}:backfill:{{{job_id}}}"


def group_backfills(group_id: str) -> str:
    return f"{PREFIX}:backfills:group:{{{group_id}}}"


def backfill_parts(job_id: str) -> str:
    return f"{PREFIX}:backfill:{{{job_id}}}:parts"


def backfill_progress(job_id: str) -> str:
    return f"{PREFIX}:backfill:{{{job_id}}}:progress"


def backfill_plan_lock(job_id: str) -> str:
    return f"{PREFIX}:backfill:{{{job_id}}}:planning"


def backfill_lease(job_id: str, partition: int) -> str:
    return f"{PREFIX}:backfill:{{{job_id}}}:lease:{partition}"


# --- Incidents (adapters.stores.incidents): each watch of a group, its level, its incidents --------
# A group's hash tag, as its rating buckets: one script moves a watch and records its incident.
INCIDENTS_KEPT_S = 90 * 86_400  # a group's incidents, readable this long after the last one
INCIDENTS_OPEN = f"{PREFIX}:incidents:open"  # "<group>|<reason>" of every open incident: closed when unwatched


def incident_watch(group_id: str, reason: str) -> str:
    """No TTL: its version names its incidents (adapters.stores.incidents says why)."""
    return f"{PREFIX}:incident-watch:{{{group_id}}}:{reason}"


def incident_level(group_id: str) -> str:
    return f"{PREFIX}:incident-level:{{{group_id}}}"


def group_incidents(group_id: str) -> str:
    return f"{PREFIX}:incidents:{{{group_id}}}"


# A group's incidents by opening time (a sorted set beside them): past INCIDENTS_KEPT, the
# oldest resolved go - a group that opens and resolves all day keeps a bounded list.
INCIDENTS_KEPT = 500


def group_incidents_order(group_id: str) -> str:
    return f"{PREFIX}:incidents-order:{{{group_id}}}"


def digest_period(group_id: str, channel: str, period: int) -> str:
    """A digest channel's period of a group (consumers.digests): pending, then sent."""
    return f"{PREFIX}:digest:{{{group_id}}}:{channel}:{period}"


# --- Review queues (adapters.stores.review_items): each queue's items, under the queue's tag -------
# One script takes a batch of a queue's items (all or each turned away at capacity), so a
# queue's keys share its hash tag. The tag is the queue's project and id, hashed: a queue id
# reused by another project (deleted, or moved by an operator's catalog file) never finds the
# first one's items, and no character of a tenant's id can break the tag (a "}" would). Labels
# are data a team paid people for: kept as long as their item (the queue's keepDays); every
# script that writes a key pushes its TTL to keepDays (a deleted queue's keys are deleted).


def review_tag(project_id: str, queue_id: str) -> str:
    return hashlib.sha256(f"{project_id}/{queue_id}".encode()).hexdigest()[:24]


def review_items(tag: str) -> str:
    """item id -> the item (JSON, ``scorer_groups.review_queues.ReviewItem``)."""
    return f"{PREFIX}:review:{{{tag}}}:items"


def review_open(tag: str) -> str:
    """The open items by when they were taken (oldest first: the order people review them in)."""
    return f"{PREFIX}:review:{{{tag}}}:open"


def review_created(tag: str) -> str:
    """Every item by when it was taken: past keepDays, the oldest go (with their labels)."""
    return f"{PREFIX}:review:{{{tag}}}:created"


def review_counts(tag: str) -> str:
    """Counters: items taken, turned away at capacity."""
    return f"{PREFIX}:review:{{{tag}}}:counts"


def review_held(tag: str) -> str:
    """item id -> "<reviewer key>\t<until>" (its reservation), and "by:<reviewer key>" -> the item
    that reviewer holds (a second ``next`` answers the same item)."""
    return f"{PREFIX}:review:{{{tag}}}:held"


def review_labels(tag: str) -> str:
    """item id -> {reviewer key: label} (JSON): kept as long as the item."""
    return f"{PREFIX}:review:{{{tag}}}:labels"


def review_labelled(tag: str) -> str:
    """"<reviewer key>\t<item id>" of every label: what ``next`` skips, without decoding labels."""
    return f"{PREFIX}:review:{{{tag}}}:labelled"


def review_done(tag: str) -> str:
    """Items labelled by reviewersPerItem people, by when: they have left the open items."""
    return f"{PREFIX}:review:{{{tag}}}:done"


def review_labels_out(tag: str) -> str:
    """Label versions not yet on the labels topic (a stream, written with the label by one
    script): the labels' outbox, emptied by the workers' exporter (consumers.label_export)."""
    return f"{PREFIX}:review:{{{tag}}}:labels-out"


def review_scores(tag: str) -> str:
    """item id -> what the machine said (the group's score, each judge's verdict): the agreement
    figures read these and the labels, never the items' texts."""
    return f"{PREFIX}:review:{{{tag}}}:scores"


# Queues with label versions to export ("<project>/<queue>"), by when one was added: the exporter
# reads this one set, not every queue's stream. Marked after the label's script (another slot); a
# mark lost to a crash in between is made up by the exporter's sweep of its queues (LABELS_SWEEP_S).
REVIEW_LABELS_PENDING = f"{PREFIX}:review:labels-pending"
LABELS_SWEEP_S = 300

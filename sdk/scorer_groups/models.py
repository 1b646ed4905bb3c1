"""Wire models of scorer groups and the scorers their members refer to: one module, the catalog's documents together.

These pydantic models are the single source of truth for the documents users save (catalog
files, SDK calls) and for every limit the spec enforces at save time. Field names on the wire
are camelCase (``sampleRate``); Python code uses snake_case attributes. Validation is strict:
``"1"`` is not a weight and ``"true"`` is not a boolean.

They live in the SDK so that the SDK installs alone; the server (``scoring.models``) uses them
as they are, and adds the one rule that needs its own engine: a pattern's ``regex`` must compile
in RE2 within a program size. The SDK leaves that rule to the server, which refuses the save
(400, naming ``regex``).
"""

from __future__ import annotations

import re
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    AwareDatetime,
    Field,
    SecretStr,
    SerializationInfo,
    StringConstraints,
    ValidationError,
    WithJsonSchema,
    field_serializer,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from scorer_groups.filters import Filter, SpanFilter
from scorer_groups.redaction import mask_url
from scorer_groups.signing import secret_key

# Re-exported: the documents' users import them from here.
from scorer_groups.wire import REVEAL_SECRETS as REVEAL_SECRETS
from scorer_groups.wire import WireModel as WireModel

MAX_MEMBERS = 20
SECRET_ROTATION_OVERLAP_S = 24 * 3_600  # a replaced channel secret keeps signing for a day
MAX_WEIGHT = 1000.0
MAX_IDLE_SECONDS = 86_400
DEFAULT_IDLE_SECONDS = 120
SEVERITIES = ("low", "medium", "high", "critical")

MemberKind = Literal["judge", "pattern", "custom"]
Severity = Literal["low", "medium", "high", "critical"]
Scope = Literal["trace", "session", "span"]
AlertMode = Literal["each", "window", "drift"]
DEFAULT_ALERT_WINDOW_S = 900
DEFAULT_ALERT_MIN_RESULTS = 10
DEFAULT_DRIFT_SIGMA = 3.0
Polarity = Literal["failure", "proper"]
PatternTarget = Literal["output", "input", "both"]
PatternTemplate = Literal["email", "phone", "credit_card", "ssn", "apology", "refusal"]

# An id names a key in Redis and a segment of an API path: a "/" would make it unreachable by
# path, a control character (NUL above all) breaks logs, headers and clients. The pattern is
# the schema's (clients and the API fuzzer read it); the validator says it in words.
ID_PATTERN = r"^[^/\x00-\x1f\x7f-\x9f]*$"
_ID_FORBIDDEN = re.compile(r"[/\x00-\x1f\x7f-\x9f]")


def _plain_id(value: str) -> str:
    if _ID_FORBIDDEN.search(value):
        raise ValueError("an id must not contain '/' or control characters")
    return value


Id = Annotated[str, StringConstraints(min_length=1, max_length=128, strip_whitespace=True),
               AfterValidator(_plain_id), WithJsonSchema({"type": "string", "minLength": 1, "maxLength": 128,
                                                          "pattern": ID_PATTERN})]
# The most calls a budget may grant per window: far past any real budget, and exact in a Lua
# number (a double) and in Redis' 64-bit integers, so larger values are refused at save.
MAX_BUDGET_CALLS = 10**12
MAX_BUDGET_TOKENS = 10**15  # exact in a double as well, and past any real spend
# Money, in the operators' currency (SGW_CURRENCY): kept as whole nanos of it in Redis,
# so a cap of 10**6 is 10**15 nanos: exact in a double, as the claim script counts them.
MAX_BUDGET_COST = 10**6
Name = Annotated[str, StringConstraints(min_length=1, max_length=200, strip_whitespace=True)]
Text = Annotated[str, StringConstraints(min_length=1, max_length=20_000)]

_MAX_URL_CHARS = 2_000


def check_url_shape(url: str) -> str:
    """Validate a user URL whole, at save time: http(s), a host, a port in range, nothing a
    parser could read two ways. Returns it unchanged; raises ValueError saying what is wrong."""
    if len(url) > _MAX_URL_CHARS:
        raise ValueError(f"url is longer than {_MAX_URL_CHARS} characters")
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 or c == "\\" for c in url):
        raise ValueError("url must not contain spaces, control characters or backslashes")
    try:
        parts = urlsplit(url)
        port = parts.port  # raises ValueError when out of range or not a number
        host = parts.hostname
    except ValueError as exc:
        raise ValueError(f"url cannot be parsed: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError("url must start with http:// or https://")
    if not host:
        raise ValueError("url has no host")
    if port == 0:
        raise ValueError("url has port 0")
    if host.startswith("[") or "%" in host:
        raise ValueError("url host is not a valid name or address")
    return url


# --- Members and the online profile ---------------------------------------------------------


class Member(WireModel):
    """One member of a group: a reference to a scorer, its weight and whether it must pass."""

    kind: MemberKind
    ref_id: Id
    weight: float = Field(1.0, ge=0, le=MAX_WEIGHT)
    gate: bool = False
    # What results and named gates call the member; filled from the scorer's name at save time
    # and kept, so it still names the member after the scorer is renamed or deleted.
    label: Name | None = None


class OnlineProfile(WireModel):
    """How a group scores live traffic. The four first keys are required: a profile is never
    completed with defaults the user did not choose (``scope`` and ``idleSeconds`` have the
    defaults the spec gives them)."""

    enabled: bool
    sample_rate: float = Field(ge=0, le=1)
    # Groups at the same rate keep the same subjects (and 10% keeps a subset of 20%); a salt gives
    # the group a sample of its own. The group's id as salt: the sample it had before.
    sample_salt: str | None = Field(None, min_length=1, max_length=200, exclude_if=lambda salt: salt is None,
                                    description="Optional: a group with a salt keeps a sample independent of "
                                                "the other groups' (printable ASCII, up to 200 characters).")
    alert_threshold: float | None = Field(ge=0, le=10)
    severity: Severity
    scope: Scope = "trace"
    idle_seconds: int = Field(DEFAULT_IDLE_SECONDS, ge=0, le=MAX_IDLE_SECONDS)
    # A must-pass member that cannot score leaves every result without a score - and so without
    # a Signal: a broken safety gate would go quiet. One "no_score" Signal says so (rate-limited).
    alert_on_no_score: bool = Field(True, description="Raise one Signal (reason no_score) when the group's "
                                                      "results start having no score; false opts out.")
    # Which traffic the group sees at all (scorer_groups.filters): decided before the sample, so
    # ``sampleRate`` is the fraction of the matching traffic.
    filter: Filter | None = Field(None, exclude_if=lambda f: f is None,
                                  description="Optional: the traces (or conversations) the group scores; "
                                              "others cost nothing. See scorer_groups.filters.")
    # Span scope: which spans of a (filtered, sampled) trace are each a subject. Kept, inert,
    # under another scope: a group flipped back to "span" finds it again.
    span_filter: SpanFilter | None = Field(None, exclude_if=lambda f: f is None,
                                           description="Span scope (required there): the spans graded, each "
                                                       "on its own - name, kind, input, output, durationMs, "
                                                       "attributes.<key>.")

    # Alerts. "each": a Signal per result below the threshold, each delivered (the
    # spec's). "window": per-result Signals stay on the signals topic (the record), and only
    # incidents page: the window's mean below the threshold opens one, a whole window at or
    # above ``alertResolveAbove`` resolves it. "drift": incidents against the group's own
    # learned level (scoring.incidents). Defaults are left out of the document.
    alert_mode: AlertMode = Field("each", exclude_if=lambda m: m == "each",
                                  description='"each" (a Signal per result), "window" or "drift" (incidents).')
    alert_window_seconds: int = Field(DEFAULT_ALERT_WINDOW_S, ge=60, le=86_400,
                                      exclude_if=lambda s: s == DEFAULT_ALERT_WINDOW_S,
                                      description="The window an incident is judged over (60-86,400 s).")
    alert_min_results: int = Field(DEFAULT_ALERT_MIN_RESULTS, ge=1, le=1_000_000,
                                   exclude_if=lambda n: n == DEFAULT_ALERT_MIN_RESULTS,
                                   description="Results a window needs before it can open an incident.")
    alert_resolve_above: float | None = Field(None, ge=0, le=10, exclude_if=lambda v: v is None,
                                              description="The mean a whole window must hold to resolve "
                                                          "(default: alertThreshold; not below it).")
    alert_no_score_rate: float | None = Field(None, ge=0, le=1, exclude_if=lambda v: v is None,
                                              description="Coverage: an incident when the window's share of "
                                                          "results without a score (or skipped for budget) "
                                                          "passes it.")
    alert_drift_sigma: float = Field(DEFAULT_DRIFT_SIGMA, gt=0, le=20,
                                     exclude_if=lambda v: v == DEFAULT_DRIFT_SIGMA,
                                     description="Drift: how many standard deviations below its learned "
                                                 "level the window's mean must drop.")

    # A shadow: a candidate judge's copy of a group, scored on live traffic beside it on
    # the same sample until ``shadowUntil`` (the trace's own time), publishing ratings only - no
    # Signal, delivery, incident or review item. Made and removed by an alignment run.
    shadow_of: Id | None = Field(None, exclude_if=lambda v: v is None,
                                 description="Set by an alignment run: the group this shadow runs beside.")
    shadow_until: AwareDatetime | None = Field(None, exclude_if=lambda v: v is None, strict=False,  # ISO text, a zone
                                          description="A shadow scores traces until this time (theirs).")
    # Review queues: people's labels check the judges; a judge that stops agreeing
    # with them opens an incident (scoring.incidents, reason "agreement").
    alert_min_agreement: float | None = Field(None, ge=0, le=1, exclude_if=lambda v: v is None,
                                              description="Agreement: an incident when a judge member's "
                                                          "Spearman correlation with people, over the "
                                                          "group's last 50 labelled review items (10 at "
                                                          "least), falls under it (0-1).")
    # Money: one rubric cannot eat its project's budget. Its judge calls reserve their
    # cost ceiling from the group's day (UTC), settled to what they cost.
    max_cost_per_day: float | None = Field(None, ge=0, le=MAX_BUDGET_COST, allow_inf_nan=False,
                                           exclude_if=lambda v: v is None,
                                           description="Optional: what the group's judge calls may cost a "
                                                       "day (UTC), in the operators' currency; past it, its "
                                                       "pairs are skipped for budget.")

    @model_validator(mode="after")
    def _alerts_fit(self) -> OnlineProfile:
        faults = []
        if self.alert_mode == "window" and self.alert_threshold is None:
            faults.append(("alertThreshold", 'required when alertMode is "window": the mean a window must '
                                             'stay at or above'))
        if (self.alert_resolve_above is not None and self.alert_threshold is not None
                and self.alert_resolve_above < self.alert_threshold):
            faults.append(("alertResolveAbove", f"must not be below alertThreshold ({self.alert_threshold:g}): "
                                                "an incident would resolve while the group is still below it"))
        if faults:
            raise ValidationError.from_exception_data("OnlineProfile", [InitErrorDetails(
                type=PydanticCustomError("alerts", why), loc=(field,), input=None) for field, why in faults])
        return self

    @model_validator(mode="after")
    def _span_scope_names_its_spans(self) -> OnlineProfile:
        if self.scope == "span" and self.span_filter is None:
            why = ('required when scope is span: which spans to grade (e.g. {"field": "kind", "op": "eq", '
                   '"value": "llm"})')
            raise ValidationError.from_exception_data("OnlineProfile", [InitErrorDetails(
                type=PydanticCustomError("missing", why), loc=("spanFilter",), input=None)])
        return self

    @field_validator("sample_salt")
    @classmethod
    def _salt_is_printable(cls, salt: str | None) -> str | None:
        if salt is not None and not all(" " <= c <= "~" for c in salt):
            raise ValueError("must be printable ASCII (letters, digits, punctuation, spaces)")
        return salt


class ScorerGroup(WireModel):
    id: Id
    name: Name
    description: str | None = Field(None, max_length=2000)
    project_id: Id
    members: list[Member] = Field(min_length=1, max_length=MAX_MEMBERS)
    online: OnlineProfile | None = None
    # Spend only what a verdict needs: judges wait for the must-pass members that cost no judge
    # call; when one of those fails, the score is 0 and the judges are not called (status
    # "skipped"). The trade-off: a skipped judge leaves no verdict to look at.
    gates_first: bool = Field(False, description="Run the must-pass members that cost no judge call first; "
                                                 "when one fails, the judges are not called (and not paid for).")

    @property
    def live(self) -> bool:
        """True when the group scores live traffic."""
        return self.online is not None and self.online.enabled


# --- The scorers members refer to -------------------------------------------------------------


MAX_JUDGE_EXAMPLES = 32  # the most a judge document may hold (SGW_JUDGE_MAX_EXAMPLES, 8 by default, is the API's)
EXAMPLE_TEXT_MAX_CHARS = 4_000  # an example's input or output: enough to show the case, bounded in the prompt
EXAMPLE_REASON_MAX_CHARS = 1_000


class JudgeExample(WireModel):
    """A graded example a judge's prompt shows it: a case and the rating people gave
    it, with why. Part of the judge's rubric: a changed example set is a new revision."""

    id: Id
    input: str = Field(max_length=EXAMPLE_TEXT_MAX_CHARS)
    output: str = Field(max_length=EXAMPLE_TEXT_MAX_CHARS)
    rating: float = Field(ge=0, le=10)
    reason: str | None = Field(None, max_length=EXAMPLE_REASON_MAX_CHARS, exclude_if=lambda v: v is None)
    # Where it came from: a labelled review item's id, or "<dataset id>:<row>" (informative only).
    source: str | None = Field(None, max_length=300, exclude_if=lambda v: v is None)


class Judge(WireModel):
    """An LLM judge: a rubric (criteria) answered with a 0-10 rating."""

    id: Id
    name: Name
    project_id: Id | None = None  # the owning project; None: shared, managed by operators
    criteria: Text
    judge_prompt: str | None = Field(None, max_length=20_000)
    requires_expected: bool = False
    model: str | None = Field(None, max_length=200)
    # What the judge reads beside the request and the response (trace scope): "retrieval" adds
    # the outputs of the trace's retriever spans - what a faithfulness rubric checks against.
    context: Literal["retrieval"] | None = Field(None, exclude_if=lambda v: v is None)  # absent: 0.2 SDKs read it
    # Graded examples shown in its prompt (scoring.judge_prompt.examples_block); left out when none,
    # so a judge without examples keeps the revision it had before they existed.
    examples: list[JudgeExample] = Field(default_factory=list, max_length=MAX_JUDGE_EXAMPLES,
                                         exclude_if=lambda v: not v)
    # Whether its verdicts are paid once for the same messages (the verdict cache):
    # false for a judge whose answer must be asked afresh each time (one sampling at a high
    # temperature on purpose, a judge of something outside the messages). Absent when true.
    cache: bool = Field(True, exclude_if=lambda v: v)

    @field_validator("examples")
    @classmethod
    def _example_ids_once(cls, examples: list[JudgeExample]) -> list[JudgeExample]:
        ids = [e.id for e in examples]
        if len(set(ids)) != len(ids):
            raise ValueError("each example id once")
        return examples


class Pattern(WireModel):
    """A tripwire: matched / not matched, read through its polarity. Exactly one of ``regex``,
    ``contains`` (case-insensitive keywords) or ``template`` says what it matches."""

    id: Id
    name: Name
    project_id: Id | None = None  # the owning project; None: shared, managed by operators
    polarity: Polarity
    target: PatternTarget = "output"
    regex: str | None = Field(None, min_length=1, max_length=5_000)
    contains: list[Annotated[str, StringConstraints(min_length=1)]] | None = Field(
        None, min_length=1, max_length=200
    )
    template: PatternTemplate | None = None

    @model_validator(mode="after")
    def _exactly_one_matcher(self) -> Pattern:
        given = [name for name in ("regex", "contains", "template") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(
                "a pattern needs exactly one of regex, contains, template"
                + (f" (got {', '.join(given)})" if given else "")
            )
        return self


class CustomEvaluator(WireModel):
    """A code scorer (Python defining ``score(...)``) or an external scorer (an HTTP URL)."""

    id: Id
    name: Name
    project_id: Id | None = None  # the owning project; None: shared, managed by operators
    type: Literal["code", "external"]
    code: str | None = Field(None, min_length=1, max_length=100_000)
    url: str | None = Field(None, max_length=2_000)
    invert: bool = False
    timeout_ms: int = Field(5_000, ge=10, le=120_000)

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        return None if value is None else check_url_shape(value)

    @field_serializer("url", when_used="json")
    def _url_shown(self, value: str | None, info: SerializationInfo) -> str | None:
        return value if value is None or (info.context or {}).get(REVEAL_SECRETS) else mask_url(value)

    @model_validator(mode="after")
    def _code_or_url(self) -> CustomEvaluator:
        if self.type == "code" and (self.code is None or self.url is not None):
            raise ValueError("a code scorer needs code and no url")
        if self.type == "external" and (self.url is None or self.code is not None):
            raise ValueError("an external scorer needs url and no code")
        return self


# --- Project-level settings -----------------------------------------------------------------


class Budget(WireModel):
    """A project's online judge budget: N calls per fixed window, and optionally a number of
    tokens and an amount of money (each call reserves a ceiling of its tokens and of their cost,
    settled to its reported usage after).

    The operators set it (an operator key, the CLI or the catalog file): the judge endpoint and
    its bill are theirs. The project's own key may only lower it, within the operators' figures:
    those are the ``project*`` fields, and the lower of the two is the cap in force."""

    project_id: Id
    judge_calls_per_window: int = Field(ge=0, le=MAX_BUDGET_CALLS)
    window_seconds: int = Field(3600, ge=1, le=30 * 86_400)
    judge_tokens_per_window: int | None = Field(None, ge=0, le=MAX_BUDGET_TOKENS)
    project_judge_calls_per_window: int | None = Field(None, ge=0, le=MAX_BUDGET_CALLS)
    project_judge_tokens_per_window: int | None = Field(None, ge=0, le=MAX_BUDGET_TOKENS)
    # Money, in the operators' currency (SGW_CURRENCY): a call reserves the cost of its token
    # ceiling at its model's price, settled to what it cost (scoring.prices).
    judge_cost_per_window: float | None = Field(None, ge=0, le=MAX_BUDGET_COST, allow_inf_nan=False,
                                                exclude_if=lambda v: v is None)
    project_judge_cost_per_window: float | None = Field(None, ge=0, le=MAX_BUDGET_COST, allow_inf_nan=False,
                                                        exclude_if=lambda v: v is None)

    @property
    def calls_cap(self) -> int:
        """The judge calls a window may take: the operators' figure, or the project's lower one."""
        own = self.project_judge_calls_per_window
        return self.judge_calls_per_window if own is None else min(own, self.judge_calls_per_window)

    @property
    def tokens_cap(self) -> int | None:
        """The judge tokens a window may take (None: no token cap)."""
        caps = [c for c in (self.judge_tokens_per_window, self.project_judge_tokens_per_window) if c is not None]
        return min(caps) if caps else None

    @property
    def cost_cap(self) -> float | None:
        """What a window's judge calls may cost (None: no money cap)."""
        caps = [c for c in (self.judge_cost_per_window, self.project_judge_cost_per_window) if c is not None]
        return min(caps) if caps else None


class AlertChannel(WireModel):
    """A webhook an agent's Signals are delivered to."""

    agent_id: Id
    url: str = Field(max_length=2_000)
    project_id: Id | None = None  # the owning project; None: shared, managed by operators
    secret: SecretStr | None = None
    previous_secret: SecretStr | None = None  # rotation: still signs until previousSecretUntil
    previous_secret_until: int | None = Field(None, ge=0)  # Unix seconds
    # Set by the webhook sender when the channel answers 410 Gone or keeps failing; applying the
    # channel with `disabled: false` turns it back on.
    disabled: bool = False
    disabled_reason: str | None = Field(None, max_length=500)
    # The body's shape (scoring/webhooks/payloads.py); pagerduty needs the integration's routingKey.
    format: Literal["standard", "slack", "pagerduty"] = "standard"
    routing_key: SecretStr | None = Field(None, max_length=200)
    # A digest: at most one message per group and period, with the count and the worst
    # result of the period, instead of one per Signal (groups alerting per result).
    digest_seconds: int | None = Field(None, ge=60, le=86_400, exclude_if=lambda v: v is None,
                                       description="At most one message per group per this many seconds "
                                                   "(60-86,400), with the count and the worst result.")

    @model_validator(mode="after")
    def _whsec_secrets(self) -> AlertChannel:
        # Checked on the model, not the field: a field error would echo the secret it refuses.
        for wire_name, value in (("secret", self.secret), ("previousSecret", self.previous_secret)):
            if value is not None:
                try:
                    secret_key(value.get_secret_value())
                except ValueError as exc:
                    raise ValueError(f"{wire_name}: {exc}") from None
        if self.format == "pagerduty" and self.digest_seconds is not None:
            raise ValueError("digestSeconds: a pagerduty channel takes no digest: PagerDuty keeps one incident per "
                             "group already (its dedup key)")
        if (self.format == "pagerduty") != (self.routing_key is not None):
            raise ValueError("routingKey: a pagerduty channel needs its integration's routing key, "
                             "and only a pagerduty channel takes one")
        return self

    def signing_secrets(self, now: float) -> list[str]:
        """The secrets a delivery is signed with now: the current one, and during a rotation's
        overlap (SECRET_ROTATION_OVERLAP_S) the replaced one too."""
        out = [self.secret.get_secret_value()] if self.secret is not None else []
        if self.previous_secret is not None and now < (self.previous_secret_until or 0):
            out.append(self.previous_secret.get_secret_value())
        return out

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        return check_url_shape(value)

    @field_serializer("url", when_used="json")
    def _url_shown(self, value: str, info: SerializationInfo) -> str:
        return value if (info.context or {}).get(REVEAL_SECRETS) else mask_url(value)

    @field_serializer("secret", "previous_secret", "routing_key", when_used="json")
    def _secret(self, value: SecretStr | None, info: SerializationInfo) -> str | None:
        if value is None:
            return None
        return value.get_secret_value() if (info.context or {}).get(REVEAL_SECRETS) else "**********"


class CatalogDocument(WireModel):
    """The file ``scorer-worker catalog apply`` takes (YAML or JSON)."""

    judges: list[Judge] = Field(default_factory=list)
    patterns: list[Pattern] = Field(default_factory=list)
    customs: list[CustomEvaluator] = Field(default_factory=list)
    groups: list[ScorerGroup] = Field(default_factory=list)
    budgets: list[Budget] = Field(default_factory=list)
    channels: list[AlertChannel] = Field(default_factory=list)


Scorer = Judge | Pattern | CustomEvaluator

"""What groups refer to, over HTTP: ``/v1/judges``, ``/v1/patterns``, ``/v1/customs`` (code and
external scorers), ``/v1/budgets/{projectId}`` and ``/v1/channels``.

Bodies are the catalog's own models (the limits and rules are theirs); the server picks ids.
A project's key writes its own documents and reads the shared scorers operators keep (projectId
null). Channel secrets are write-only: responses say whether one is set, never what it is.
"""

import hashlib
import uuid
from typing import Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, Depends, Path, Request, Response
from pydantic import Field, SecretStr, ValidationError
from pydantic.json_schema import SkipJsonSchema

from scorer_groups.alignments import JudgeDisagreement
from scorer_groups.api_models import BudgetView, Channel, JudgeTemplates
from scorer_groups.models import JudgeExample
from scoring import judge_templates
from scoring.catalog import doc_id, etag
from scoring.errors import InvalidDocument, NotFound
from scoring.models import (
    ID_PATTERN,
    AlertChannel,
    Budget,
    CustomEvaluator,
    Id,
    Judge,
    Name,
    Pattern,
    Text,
    WireModel,
)
from scoring.redact import mask_url
from services.judge_examples import JudgeExamples
from worker.api.auth import Client, Who
from worker.api.groups import ChangePage, IfMatch, changes_page
from worker.api.pages import Cursor, Limit, OffsetCursor, Page, page
from worker.settings import Settings

router = APIRouter(prefix="/v1")
M = TypeVar("M", bound=WireModel)


def validated(model: type[M], doc: dict[str, Any]) -> M:
    """``doc`` as a ``model``, or a 400 naming each wrong field."""
    try:
        return model.model_validate(doc)
    except ValidationError as exc:
        raise InvalidDocument.from_validation(exc) from None


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


# --- Judges, patterns, customs: one shape of routes each -------------------------------------


class JudgeBody(Judge):
    id: SkipJsonSchema[Id | None] = None  # type: ignore[assignment]  # the server picks ids
    # From a template (GET /v1/judge-templates), the fields given here override the template's;
    # without one, name and criteria are required.
    template: str | None = Field(None, max_length=100, description="A judge template's name to start from.")
    name: Name | None = None  # type: ignore[assignment]
    criteria: Text | None = None  # type: ignore[assignment]

    def fields(self) -> dict[str, Any]:
        """The judge's fields: the template's, then those given (or just those given)."""
        given = self.model_dump(mode="json", by_alias=True, exclude_unset=True)
        name = given.pop("template", None)
        if name is None:
            return {k: v for k, v in self.stored().items()
                    if k != "template" and not (k in ("name", "criteria") and v is None)}  # "required", said so
        template = judge_templates.BY_NAME.get(name)
        if template is None:
            raise InvalidDocument.of([f"template: no judge template named {name!r} (templates: "
                                      f"{', '.join(judge_templates.BY_NAME)})"])
        return {**judge_templates.judge_fields(template), **given}


class PatternBody(Pattern):
    id: SkipJsonSchema[Id | None] = None  # type: ignore[assignment]  # the server picks ids


class CustomBody(CustomEvaluator):
    id: SkipJsonSchema[Id | None] = None  # type: ignore[assignment]  # the server picks ids


class JudgePage(Page):
    items: list[Judge]


class PatternPage(Page):
    items: list[Pattern]


class CustomPage(Page):
    items: list[CustomEvaluator]


# An id in a path is held to the same rule as one in a body (no "/", no control characters).
PathId = Annotated[str, Path(alias="id", max_length=128, pattern=ID_PATTERN)]


def _scorer_routes(kind: str, noun: str, model: type[WireModel], body_model: type[WireModel],
                   page_model: type[Page], id_prefix: str) -> None:
    """GET and POST ``/v1/<kind>``, GET, PUT and DELETE ``/v1/<kind>/{id}``."""

    def to_doc(body: WireModel, id_: str, project_id: str | None) -> WireModel:
        if getattr(body, "id", None) is not None:
            raise InvalidDocument("id: chosen by the server (from the URL or on create); leave it out")
        fields = body.fields() if isinstance(body, JudgeBody) else body.stored()
        return validated(model, {**fields, "id": id_, "projectId": project_id})

    async def list_docs(client: Client, limit: Limit = 50, cursor: Cursor = None) -> Any:
        items, next_cursor = page(await client.scorers.list(kind), doc_id, limit, cursor)
        return page_model(items=items, next_cursor=next_cursor)

    async def create_doc(body: body_model, client: Client, who: Who, request: Request,  # type: ignore[valid-type]
                         response: Response) -> Any:
        requested = getattr(body, "project_id", None)  # an operator without one shares the scorer
        doc = to_doc(body, _new_id(id_prefix), requested if who.operator else who.project_for(requested))
        await client.scorers.put(doc, create=True)
        response.headers["Location"] = f"{request.url.path}/{doc_id(doc)}"
        response.headers["ETag"] = etag(doc)
        return doc

    async def get_doc(doc_id_: PathId, client: Client,
                      response: Response) -> Any:
        doc = await client.scorers.get(kind, doc_id_)
        response.headers["ETag"] = etag(doc)
        return doc

    async def replace_doc(doc_id_: PathId, body: body_model,  # type: ignore[valid-type]
                          client: Client, who: Who, response: Response, if_match: IfMatch = None) -> Any:
        stored = await client.scorers.get(kind, doc_id_)
        owner = getattr(stored, "project_id", None)
        requested = getattr(body, "project_id", None)
        if requested is not None and requested != owner:  # an operator may move it; a project may not
            owner = who.project_for(requested)
        doc = to_doc(body, doc_id_, owner)
        await client.scorers.put(doc, if_match=if_match or "*")
        response.headers["ETag"] = etag(doc)
        return doc

    async def delete_doc(doc_id_: PathId, client: Client,
                         if_match: IfMatch = None) -> Response:
        await client.scorers.delete(kind, doc_id_, if_match=if_match)
        return Response(status_code=204)

    async def doc_changes(doc_id_: PathId, client: Client, who: Who,
                          request: Request, limit: Limit = 50, cursor: OffsetCursor = None) -> Any:
        return await changes_page(request, client, who, kind, doc_id_, limit, cursor)

    router.add_api_route(f"/{kind}", list_docs, methods=["GET"], response_model=page_model, tags=[kind],
                         name=f"list_{kind}", summary=f"List {kind}")
    router.add_api_route(f"/{kind}", create_doc, methods=["POST"], response_model=model, status_code=201,
                         tags=[kind], name=f"create_{noun}", summary=f"Create a {noun}")
    router.add_api_route(f"/{kind}/{{id}}", get_doc, methods=["GET"], response_model=model, tags=[kind],
                         name=f"get_{noun}", summary=f"Get a {noun}")
    router.add_api_route(f"/{kind}/{{id}}", replace_doc, methods=["PUT"], response_model=model, tags=[kind],
                         name=f"replace_{noun}", summary=f"Replace a {noun}")
    router.add_api_route(f"/{kind}/{{id}}", delete_doc, methods=["DELETE"], status_code=204,
                         response_class=Response, tags=[kind], name=f"delete_{noun}", summary=f"Delete a {noun}")
    router.add_api_route(f"/{kind}/{{id}}/changes", doc_changes, methods=["GET"], response_model=ChangePage,
                         tags=[kind], name=f"{noun}_changes", summary=f"Who changed a {noun}, when, and what")


_scorer_routes("judges", "judge", Judge, JudgeBody, JudgePage, "jdg")


# --- a judge's graded examples -----------------------------------------------------


class ExampleBody(WireModel):
    """An example written out - ``input``, ``output``, ``rating`` (0-10), ``reason``? - or taken
    from a labelled review item (``fromItem``) or a dataset row with a humanRating and an output
    (``fromRow``: ``{"dataset", "row", "version"?}``)."""

    input: str | None = None
    output: str | None = None
    rating: float | None = None
    reason: str | None = None
    from_item: str | None = Field(None, max_length=200)
    from_row: dict[str, Any] | None = None


def examples_of(request: Request, client: Client, who: Who) -> JudgeExamples:
    settings: Settings = request.app.state.settings
    return JudgeExamples(client.store, who, settings.judge_max_examples)


Examples = Annotated[JudgeExamples, Depends(examples_of)]
ExampleId = Annotated[str, Path(alias="exampleId", max_length=128, pattern=ID_PATTERN)]


@router.get("/judges/{id}/examples", response_model=list[JudgeExample], tags=["judges"])
async def list_examples(judge_id: PathId, examples: Examples) -> list[JudgeExample]:
    """The graded examples the judge's prompt shows it, in the order shown."""
    return await examples.list(judge_id)


@router.post("/judges/{id}/examples", response_model=JudgeExample, status_code=201, tags=["judges"])
async def add_example(judge_id: PathId, body: ExampleBody, examples: Examples) -> JudgeExample:
    """Add a graded example to the judge (up to ``SGW_JUDGE_MAX_EXAMPLES``, 8 by default): part of
    its rubric from now on - a new revision, so backfills grade again."""
    return await examples.add(judge_id, body.model_dump(by_alias=True, exclude_unset=True))


@router.get("/judges/{id}/disagreements", response_model=list[JudgeDisagreement], tags=["judges"])
async def judge_disagreements(judge_id: PathId, examples: Examples) -> list[JudgeDisagreement]:
    """The labelled review items where the judge and people are furthest apart (up to 20, the
    largest gap first): the natural examples to add (``fromItem``)."""
    return await examples.disagreements(judge_id)


@router.delete("/judges/{id}/examples/{exampleId}", status_code=204, response_class=Response, tags=["judges"])
async def delete_example(judge_id: PathId, example_id: ExampleId, examples: Examples) -> Response:
    await examples.delete(judge_id, example_id)
    return Response(status_code=204)


@router.get("/judge-templates", response_model=JudgeTemplates, tags=["judges"])
async def list_judge_templates(_: Who) -> JudgeTemplates:
    """The shipped judge rubrics - helpfulness, faithfulness to retrieved context, answer
    relevance, instruction following, toxicity, refusal correctness - each with what it reads and
    a small set of rows people labelled. ``POST /v1/judges`` with ``"template": name`` creates a
    judge from one."""
    return JudgeTemplates(items=list(judge_templates.TEMPLATES))
_scorer_routes("patterns", "pattern", Pattern, PatternBody, PatternPage, "pat")
_scorer_routes("customs", "custom", CustomEvaluator, CustomBody, CustomPage, "cst")


# --- Budgets: one per project, addressed by it -------------------------------------------------


class BudgetBody(Budget):
    project_id: SkipJsonSchema[Id | None] = None  # type: ignore[assignment]


class BudgetPage(Page):
    items: list[Budget]


ProjectId = Annotated[str, Path(alias="projectId", max_length=128, pattern=ID_PATTERN)]


def _own_project(who: Who, project_id: str) -> None:
    if not who.operator and project_id != who.project_id:
        raise NotFound(f"no budget with id {project_id!r}")


@router.get("/budgets", response_model=BudgetPage, tags=["budgets"])
async def list_budgets(client: Client, limit: Limit = 50, cursor: Cursor = None) -> Any:
    items, next_cursor = page(await client.scorers.list("budgets"), doc_id, limit, cursor)
    return BudgetPage(items=items, next_cursor=next_cursor)


@router.get("/budgets/{projectId}", response_model=BudgetView, tags=["budgets"])
async def get_budget(project_id: ProjectId, client: Client, response: Response) -> Any:
    """The project's budget, and what its current window has used: judge calls (retries
    included) and judge tokens."""
    view = await client.scorers.budget_use(project_id)
    response.headers["ETag"] = etag(await client.scorers.get("budgets", project_id))
    return view


@router.put("/budgets/{projectId}", response_model=Budget, tags=["budgets"])
async def put_budget(project_id: ProjectId, body: BudgetBody, client: Client, who: Who, response: Response,
                     if_match: IfMatch = None) -> Any:
    """Set the project's judge-call budget. An operator key sets the operators' figures (created
    or replaced); the project's own key may only lower them: its ``judgeCallsPerWindow`` and
    ``judgeTokensPerWindow`` become the project's own caps, refused (403) above the operators'.
    The lower of the two is in force."""
    _own_project(who, project_id)
    sent = body.model_dump(mode="json", by_alias=True, exclude_unset=True)  # what was sent: rule 1 keeps the rest
    saved = await client.scorers.put(validated(Budget, {**sent, "projectId": project_id}), if_match=if_match)
    response.headers["ETag"] = etag(saved)
    return saved


@router.delete("/budgets/{projectId}", status_code=204, response_class=Response, tags=["budgets"])
async def delete_budget(project_id: ProjectId, client: Client, if_match: IfMatch = None) -> Response:
    await client.scorers.delete("budgets", project_id, if_match=if_match)
    return Response(status_code=204)


# --- Alert channels: secrets go in, never out -------------------------------------------------


class ChannelBody(WireModel):
    """An agent's webhook. Sending the same agentId and url again replaces it (a new secret
    rotates: the old one keeps signing for a day)."""

    agent_id: Id
    url: str
    secret: SecretStr | None = Field(None, description="whsec_ + base64; write-only.")
    project_id: Id | None = None
    format: Literal["standard", "slack", "pagerduty"] = "standard"
    routing_key: SecretStr | None = Field(None, description="PagerDuty's Events API v2 routing key; write-only.")
    disabled: bool = Field(False, description="false turns a channel the sender disabled back on.")
    digest_seconds: int | None = Field(None, description="At most one message per group per this many seconds "
                                                         "(60-86,400), with the count and the worst result.")


class ChannelPage(Page):
    items: list[Channel]


def channel_id(channel: AlertChannel) -> str:
    """A channel's id in the API: stable, path-safe, derived from what identifies it."""
    return "ch_" + hashlib.blake2b(doc_id(channel).encode(), digest_size=8).hexdigest()


def _out(channel: WireModel) -> Channel:
    assert isinstance(channel, AlertChannel)
    return Channel(id=channel_id(channel), agent_id=channel.agent_id, url=mask_url(channel.url),
                   project_id=channel.project_id, has_secret=channel.secret is not None, format=channel.format,
                   disabled=channel.disabled, disabled_reason=channel.disabled_reason,
                   digest_seconds=channel.digest_seconds)


async def _channel(client: Client, id_: str) -> AlertChannel:
    found = [c for c in await client.scorers.list("channels")
             if isinstance(c, AlertChannel) and channel_id(c) == id_]
    if not found:
        raise NotFound(f"no alert channel with id {id_!r}")
    return found[0]


@router.get("/channels", response_model=ChannelPage, tags=["channels"])
async def list_channels(client: Client, limit: Limit = 50, cursor: Cursor = None) -> Any:
    outs = [_out(c) for c in await client.scorers.list("channels")]
    items, next_cursor = page(outs, lambda c: c.id, limit, cursor)
    return ChannelPage(items=items, next_cursor=next_cursor)


@router.post("/channels", response_model=Channel, status_code=201, tags=["channels"])
async def put_channel(body: ChannelBody, client: Client, who: Who, request: Request, response: Response) -> Any:
    secret = body.secret.get_secret_value() if body.secret is not None else None
    routing_key = body.routing_key.get_secret_value() if body.routing_key is not None else None
    fields: dict[str, Any] = {"agentId": body.agent_id, "url": body.url, "secret": secret,
                              "projectId": who.project_for(body.project_id), "format": body.format,
                              "routingKey": routing_key, "digestSeconds": body.digest_seconds}
    if "disabled" in body.model_fields_set:  # unsent: a mark the sender set survives the save
        fields["disabled"] = body.disabled
    doc = validated(AlertChannel, fields)
    await client.scorers.put(doc)
    out = _out(doc)
    response.headers["Location"] = f"{request.url.path}/{out.id}"
    return out


@router.get("/channels/{id}", response_model=Channel, tags=["channels"])
async def get_channel(id_: PathId, client: Client) -> Any:
    return _out(await _channel(client, id_))


@router.delete("/channels/{id}", status_code=204, response_class=Response, tags=["channels"])
async def delete_channel(id_: PathId, client: Client) -> Response:
    channel = await _channel(client, id_)
    await client.scorers.delete("channels", doc_id(channel))
    return Response(status_code=204)

"""A deterministic, local OpenAI-compatible chat-completions server: the LLM judge for tests and the demo.

Tests never mock HTTP: they start a ``JudgeServer`` on 127.0.0.1. A ``[[rating=N]]`` marker rates a
request N (else ``default_rating``); ``script(Behaviour...)`` queues other answers, first in first out.
As a process: ``python -m devtools.judge_server --port 0``. Markers, examples, scripts: docs/design-notes.md.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import threading
import time
import uuid
from collections import Counter, deque
from dataclasses import dataclass, replace
from typing import Any, Literal, Self

from devtools.local_http import ClosingServer, LocalHttpServer, QuietHandler

MARKER = re.compile(r"\[\[rating=(-?\d+(?:\.\d+)?)\]\]")
# [[rating@MODEL=N]]: a rating for requests that ask MODEL only, so one prompt can give two
# judges (with different ``model`` settings) different ratings. It wins over plain markers.
MODEL_MARKER = re.compile(r"\[\[rating@([\w.:-]+)=(-?\d+(?:\.\d+)?)\]\]")
# [[key=K]]: count the request under K (``JudgeServer.calls_by_key``); the last marker wins.
KEY_MARKER = re.compile(r"\[\[key=([^\]\s]+)\]\]")
# A judge's graded examples as its prompt shows them, and the case marker that ties a case to one.
EXAMPLE_BLOCK = re.compile(r"<example (\d+)>\n(.*?)\n</example \1>", re.S)
EXAMPLE_PARTS = re.compile(r"Response:\n(.*)\n\nRating: (-?\d+(?:\.\d+)?)", re.S)
CASE_MARKER = re.compile(r"\[\[case=([^\]\s]+)\]\]")
MODEL_ID = "judge-deterministic"
_ERROR_KINDS = {  # status code -> (OpenAI error type, error code)
    400: ("invalid_request_error", "invalid_request"), 401: ("invalid_request_error", "invalid_api_key"),
    404: ("invalid_request_error", "not_found"), 429: ("requests", "rate_limit_exceeded"),
    500: ("server_error", "server_error"), 503: ("server_error", "service_unavailable"),
}

Kind = Literal["deterministic", "rating", "content", "status", "malformed", "disconnect"]


@dataclass(frozen=True)
class Behaviour:
    """How to answer one request. Build it with the class-method constructors below."""

    kind: Kind = "deterministic"
    value: Any = None  # the rating (any JSON value) or the raw assistant content
    justification: str = "Scripted judge answer"
    status_code: int = 200
    retry_after: float | None = None  # seconds, sent as the Retry-After header
    body: Any = None  # error body: dict/list (JSON-encoded) or str (sent as is); None = OpenAI-style
    delay: float = 0.0  # seconds to wait before answering (or before dropping the connection)

    @classmethod
    def deterministic(cls, *, delay: float = 0.0) -> Behaviour:
        """The default: rating from the ``[[rating=N]]`` marker, else the server's default rating."""
        return cls("deterministic", delay=delay)

    @classmethod
    def rating(cls, value: Any, justification: str = "Scripted judge answer", *, delay: float = 0.0
               ) -> Behaviour:
        """200 with content ``{"rating": value, "justification": ...}``; value may be any JSON value."""
        return cls("rating", value=value, justification=justification, delay=delay)

    @classmethod
    def content(cls, text: str, *, delay: float = 0.0) -> Behaviour:
        """200 with arbitrary assistant content (malformed JSON, fenced JSON, prose...)."""
        return cls("content", value=text, delay=delay)

    @classmethod
    def status(cls, code: int, retry_after: float | None = None, body: Any = None, *, delay: float = 0.0
               ) -> Behaviour:
        """An HTTP error with an OpenAI-style error body (or ``body`` if given)."""
        return cls("status", status_code=code, retry_after=retry_after, body=body, delay=delay)

    @classmethod
    def hang(cls, seconds: float) -> Behaviour:
        """Wait ``seconds`` (to trip client timeouts), then answer like the default."""
        return cls("deterministic", delay=seconds)

    @classmethod
    def malformed_body(cls, *, delay: float = 0.0) -> Behaviour:
        """200 whose body is not JSON at all."""
        return cls("malformed", delay=delay)

    @classmethod
    def disconnect(cls, *, delay: float = 0.0) -> Behaviour:
        """Close the connection without any response (a transport error for the client)."""
        return cls("disconnect", delay=delay)

    def with_delay(self, seconds: float) -> Behaviour:
        """This behaviour, answered after ``seconds`` of latency."""
        return replace(self, delay=seconds)


def _fmt(number: Any) -> str:
    return f"{number:g}" if isinstance(number, int | float) and not isinstance(number, bool) else str(number)


def _text(content: Any) -> str:
    """Message content as text: a string, or the text parts of a content-part list."""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def _error_body(code: int, message: str) -> dict[str, Any]:
    err_type, err_code = _ERROR_KINDS.get(code, ("server_error" if code >= 500 else "invalid_request_error",
                                                  str(code)))
    return {"error": {"message": message, "type": err_type, "param": None, "code": err_code}}


class JudgeServer(LocalHttpServer):
    """The server; ``start()`` binds a free port on 127.0.0.1 and serves from a daemon thread."""

    def __init__(self, *, api_key: str | None = None, default_rating: float = 7.0, port: int = 0,
                 refuses: frozenset[str] = frozenset()) -> None:
        # port 0 = a free port chosen at each start; a stopped server has none (and starts again)
        super().__init__(type("Handler", (_Handler,), {"judge": self}), port=port, bind_now=False,
                         thread_name="judge-server", server_class=ClosingServer)
        # Request parameters answered 400 as OpenAI answers them: "max_tokens" as its reasoning
        # models do, "response_format" as some gateways do.
        self.refuses = refuses
        self.api_key = api_key
        self.default_rating = default_rating
        self.requests: list[dict[str, Any]] = []  # chat request bodies, each with "_headers"
        # Chat requests by the [[key=K]] marker of their last user message (those without one are
        # not counted here): how many times each trace, say, was judged.
        self.calls_by_key: Counter[str] = Counter()
        # The usage (prompt, completion tokens) of every completion answered: what a provider
        # would bill, whether or not the client read the answer.
        self.usages: list[tuple[int, int]] = []
        # The most chat requests answered at once among those since start or reset (tests check a
        # client's cap with it; a request still hanging from before a reset does not count).
        self.peak_in_flight = 0
        self._in_flight = 0
        self._generation = 0
        self._default = Behaviour.deterministic()
        self._queue: deque[Behaviour] = deque()
        self._lock = threading.Lock()
        self._stopping = threading.Event()  # set on stop: waits end and hung requests are dropped

    # --- lifecycle --------------------------------------------------------------------------

    def start(self) -> Self:
        self._stopping.clear()
        return super().start()

    def stop(self) -> None:
        self._stopping.set()
        super().stop()

    @property
    def port(self) -> int:
        if not self.bound:
            raise RuntimeError("judge server is not running")
        return super().port

    @property
    def base_url(self) -> str:
        return f"{super().base_url}/v1"

    # --- scripting --------------------------------------------------------------------------

    def script(self, *behaviours: Behaviour) -> None:
        with self._lock:
            self._queue.extend(behaviours)

    def set_default(self, behaviour: Behaviour) -> None:
        with self._lock:
            self._default = behaviour

    def reset(self) -> None:
        with self._lock:
            self._queue.clear()
            self.requests.clear()
            self.calls_by_key.clear()
            self.usages.clear()
            self.peak_in_flight = self._in_flight = 0
            self._generation += 1
            self._default = Behaviour.deterministic()

    def _take(self, body: dict[str, Any]) -> Behaviour:
        """Record the request and pick its behaviour: the next scripted one, else the default."""
        users = [m for m in body["messages"] if isinstance(m, dict) and m.get("role") == "user"]
        keys = KEY_MARKER.findall(_text(users[-1].get("content"))) if users else []
        with self._lock:
            self.requests.append(body)
            if keys:
                self.calls_by_key[keys[-1]] += 1
            return self._queue.popleft() if self._queue else self._default

    def _entered(self, step: int, generation: int | None = None) -> int:
        with self._lock:
            if generation is None or generation == self._generation:
                self._in_flight += step
                self.peak_in_flight = max(self.peak_in_flight, self._in_flight)
            return self._generation

    def _deterministic_rating(self, messages: list[Any], model: str | None = None) -> float:
        users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
        text = _text(users[-1].get("content")) if users else ""
        examples = [p.groups() for p in (EXAMPLE_PARTS.search(b) for _, b in EXAMPLE_BLOCK.findall(text)) if p]
        text = EXAMPLE_BLOCK.sub("", text)  # the case alone
        cases = set(CASE_MARKER.findall(text))
        for output, rating in examples:
            if (output.strip() and output.strip() in text) or cases & set(CASE_MARKER.findall(output)):
                return float(rating) if "." in rating else int(rating)
        found = [n for m, n in MODEL_MARKER.findall(text) if m == model] or MARKER.findall(text)
        if not found:
            return self.default_rating
        return float(found[-1]) if "." in found[-1] else int(found[-1])


class _Handler(QuietHandler):  # HTTP/1.1: keep-alive, like the real API
    judge: JudgeServer
    disable_nagle_algorithm = True  # headers and body go out in two writes; don't stall the second

    def _send(self, code: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
        try:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except OSError:  # the client gave up (e.g. timed out) before we answered
            self.close_connection = True

    def _authorized(self) -> bool:
        key = self.judge.api_key
        if key is None or self.headers.get("Authorization") == f"Bearer {key}":
            return True
        self._send(401, _error_body(401, "Incorrect API key provided."))
        return False

    def do_GET(self) -> None:
        if self.path.split("?")[0].rstrip("/") != "/v1/models":
            self._send(404, _error_body(404, f"Unknown path {self.path}"))
        elif self._authorized():
            self._send(200, {"object": "list", "data": [
                {"id": MODEL_ID, "object": "model", "created": 0, "owned_by": "judge-server"}]})

    def do_POST(self) -> None:
        raw = self.read_body()  # always drain the body
        if self.path.split("?")[0].rstrip("/") != "/v1/chat/completions":
            self._send(404, _error_body(404, f"Unknown path {self.path}"))
            return
        if not self._authorized():
            return
        try:
            body = json.loads(raw)
            if not (isinstance(body, dict) and "model" in body and isinstance(body.get("messages"), list)):
                raise ValueError("body must be an object with 'model' and a 'messages' list")
        except ValueError as exc:  # json.JSONDecodeError is a ValueError
            self._send(400, _error_body(400, f"Invalid request body: {exc}"))
            return
        refused = next((name for name in sorted(self.judge.refuses) if name in body), None)
        if refused is not None:
            self._send(400, _refusal(refused))
            return
        body["_headers"] = {name.lower(): value for name, value in self.headers.items()}
        behaviour = self.judge._take(body)
        generation = self.judge._entered(+1)
        try:
            if behaviour.delay > 0 and self.judge._stopping.wait(behaviour.delay):
                self.close_connection = True  # the server is stopping: drop the hung request
                return
            self._answer(behaviour, body)
        finally:
            self.judge._entered(-1, generation)

    def _answer(self, b: Behaviour, body: dict[str, Any]) -> None:
        if b.kind == "disconnect":
            self.close_connection = True
        elif b.kind == "malformed":
            self._send(200, "<html>this is not JSON {")
        elif b.kind == "status":
            headers = {"Retry-After": _fmt(b.retry_after)} if b.retry_after is not None else {}
            default_body = _error_body(b.status_code, f"Scripted error {b.status_code}")
            self._send(b.status_code, default_body if b.body is None else b.body, headers)
        elif b.kind == "content":
            self._complete(body, str(b.value))
        else:  # a rating: scripted, or the deterministic default
            value, note = b.value, b.justification
            if b.kind == "deterministic":
                value = self.judge._deterministic_rating(body["messages"], body.get("model"))
                note = f"Deterministic judge: rating {_fmt(value)}"
            self._complete(body, json.dumps({"rating": value, "justification": note}))

    def _complete(self, body: dict[str, Any], text: str) -> None:
        answer = _completion(body, text)
        with self.judge._lock:
            self.judge.usages.append((answer["usage"]["prompt_tokens"], answer["usage"]["completion_tokens"]))
        self._send(200, answer)


def _refusal(parameter: str) -> dict[str, Any]:
    """OpenAI's answer to a parameter the model does not take, word for word in its shape."""
    instead = " Use 'max_completion_tokens' instead." if parameter == "max_tokens" else ""
    return {"error": {"message": f"Unsupported parameter: '{parameter}' is not supported with this model.{instead}",
                      "type": "invalid_request_error", "param": parameter, "code": "unsupported_parameter"}}


def _completion(body: dict[str, Any], text: str) -> dict[str, Any]:
    """A chat.completion object answering ``body`` with assistant ``text``; tokens are word counts."""
    prompt = sum(len(_text(m.get("content")).split()) for m in body["messages"] if isinstance(m, dict))
    completion = len(text.split())
    message = {"role": "assistant", "content": text}
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    return {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion",
            "created": int(time.time()), "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}], "usage": usage}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Deterministic local OpenAI-compatible judge server.")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0 = a free one)")
    parser.add_argument("--api-key", default=None, help="require 'Authorization: Bearer <key>'")
    parser.add_argument("--default-rating", type=float, default=7.0)
    args = parser.parse_args(argv)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    server = JudgeServer(api_key=args.api_key, default_rating=args.default_rating, port=args.port).start()
    print(f"judge server listening on {server.base_url}", flush=True)
    try:
        done.wait()
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

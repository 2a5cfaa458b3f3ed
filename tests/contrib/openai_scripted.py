"""A scripted model for the OpenAI Agents SDK's own run loop: the SDK's ``Model`` interface
answering each request with the next scripted step. No network, no API key."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from agents import ModelResponse, RunConfig, Usage
from agents.models.interface import Model
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputRefusal,
    ResponseOutputText,
    ResponseStreamEvent,
)

#: Every run in the tests: no trace export.
QUIET = RunConfig(tracing_disabled=True)

Step = list[Any] | BaseException | Callable[[], Awaitable[list[Any]]]


class ScriptedModel(Model):
    """Each request gets the next step: output items, an exception to raise (the API failing,
    the process dying), or a coroutine function returning output items (to meet a barrier)."""

    def __init__(self, *steps: Step) -> None:
        self.steps = list(steps)
        self.inputs: list[list[dict[str, Any]]] = []

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        given = args[1] if len(args) > 1 else kwargs["input"]
        self.inputs.append([] if isinstance(given, str) else list(given))
        step = self.steps.pop(0)
        if isinstance(step, BaseException):
            raise step
        output = step if isinstance(step, list) else await step()
        return ModelResponse(output=output, usage=Usage(requests=1), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[ResponseStreamEvent]:
        raise NotImplementedError

    def tool_outputs(self, request: int = -1) -> dict[str, str]:
        """What the model was given as tool results in a request: call id -> output."""
        return {
            item["call_id"]: item["output"]
            for item in self.inputs[request]
            if item.get("type") == "function_call_output"
        }


def call(call_id: str, tool: str, **arguments: Any) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        type="function_call", call_id=call_id, name=tool, arguments=json.dumps(arguments)
    )


def say(text: str) -> ResponseOutputMessage:
    content: list[ResponseOutputText | ResponseOutputRefusal] = [
        ResponseOutputText(type="output_text", text=text, annotations=[])
    ]
    return ResponseOutputMessage(
        id="msg", type="message", role="assistant", status="completed", content=content
    )

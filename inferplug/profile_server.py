"""The profile's [server] table: what one `inferplug serve` client may ask for, and how the server guards itself.

Every limit has a default that serves ordinary clients and bounds what a hostile one costs; `inferplug serve`
flags and INFERPLUG_SERVER__<KEY> override them. A request over a limit gets a 4xx naming the key.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ServerOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    max_prompts: int = Field(default=64, ge=1)  # prompts in one /v1/completions request
    max_n: int = Field(default=16, ge=1, le=128)  # choices per prompt
    max_messages: int = Field(default=512, ge=1)
    max_tools: int = Field(default=128, ge=0)
    max_schema_bytes: int = Field(default=64 * 1024, ge=0)  # a response_format schema's (or all tools') JSON
    # the properties of all objects in a response_format schema (or in all tools): xgrammar's compile time grows
    # faster than their count (256 compile in ~0.1-0.3 s here, 1,000 in one object in ~5 s), and a compile holds a
    # prompt worker, which the other clients' prompts then wait for
    max_schema_properties: int = Field(default=256, ge=0)
    # how deep a request body's JSON may nest: deeper, parsing it (and rendering or compiling what it holds) recurses
    # past Python's stack; a schema nested 200 objects deep takes xgrammar ~2 s
    max_json_depth: int = Field(default=64, ge=8)
    max_stop: int = Field(default=16, ge=0)  # stop strings, and stop_token_ids, per request
    max_stop_chars: int = Field(default=256, ge=1)  # the longest stop string
    max_logit_bias: int = Field(default=1024, ge=0)  # tokens one logit_bias names (OpenAI's own bound is 300)
    max_prompt_tokens: int | None = Field(default=None, ge=1)  # None: the context length (the backend checks it)
    max_total_tokens: int = Field(default=131072, ge=1)  # prompts x n x max_tokens of one request
    # JSON values in one body (counted as its commas, before parsing; 64 prompts of 4096 token ids): parsing millions
    # holds the GIL for seconds, stalling every stream, even for a request that a limit then refuses
    max_json_values: int = Field(default=262144, ge=1)
    max_waiting: int = Field(default=256, ge=1)  # requests waiting for their first token; more get 429
    # the same, per client (its tenant_header value, else its address): one client's flood leaves room for others
    max_waiting_per_client: int = Field(default=64, ge=1)
    # requests of one client in flight, from admission to the response's end: a client that stops reading its streams
    # (or a flood of long ones) holds at most this many requests in flight, and the others' streams keep their pace
    max_in_flight_per_client: int = Field(default=64, ge=1)
    queue_timeout_s: float = Field(default=300.0, gt=0)  # a request still without its first token then gets 503
    body_read_timeout_s: float = Field(default=30.0, gt=0)  # a body that trickles in longer gets 408
    stream_send_timeout_s: float = Field(default=30.0, gt=0)  # a stream its client stops reading is then cut off
    shutdown_grace_s: float = Field(default=10.0, ge=0)  # SIGTERM: in-flight requests get this long, then abort
    # The request header that names a client's tenant (set by a trusted proxy), e.g. "X-Tenant". Prefix-cache
    # entries are salted by the API key and this header's value, so tenants never share cached prompts.
    tenant_header: str | None = None
    # Host headers accepted when the server is bound to loopback without an API key (DNS rebinding guard);
    # ["*"] accepts any host. Loopback names are always accepted.
    allowed_hosts: list[str] = Field(default_factory=list)

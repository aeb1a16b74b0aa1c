"""gpt-oss's harmony replies split into content, reasoning and tool calls (stages/harmony.py), with OpenAI's own chat
template as llama.cpp ships it for the reference: an assistant turn the template renders (its thinking, answer or tool
call, in harmony) is fed back as the model's reply, token by token through the output stage, and must come out as
the fields it was rendered from. The tokenizer is a real byte-level BPE with harmony's control tokens as special
tokens, as o200k_harmony has them."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferplug.chat_template import render_chat, template_variables
from inferplug.frontend.tool_calls import calls_from_deltas
from inferplug.stages.harmony import HarmonySplitter
from inferplug.stages.reasoning import detect_parser
from tests.stages.reply_stream import split_at, stream_reply

TEMPLATE = Path(__file__).resolve().parents[2] / ".venv" / "llama.cpp" / "models" / "templates" / \
    "openai-gpt-oss-120b.jinja"
CONTROL = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|constrain|>", "<|return|>", "<|call|>"]
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": {"type": "object",
                                                           "properties": {"location": {"type": "string"}}}}}
USER = {"role": "user", "content": "What is the weather in Paris?"}


@pytest.fixture(scope="module")
def template() -> str:
    if not TEMPLATE.is_file():
        pytest.fail(f"{TEMPLATE} is missing: `make setup` fetches it (tests/fixtures/fetch_llama_cpp_converter.py)")
    return TEMPLATE.read_text()


@pytest.fixture(scope="module")
def tokenizer(template):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(CONTROL)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|return|>", chat_template=template)


def reply_to(tokenizer, messages: list[dict], tools: list[dict] | None = None) -> str:
    """The model's side of the last turn as the template renders it: the chat rendered whole (no generation prompt)
    less the prompt that asks for that turn, which ends at `<|start|>assistant`."""
    prompt = render_chat(tokenizer, None, [USER], tools)
    whole = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=False)
    assert prompt.endswith("<|start|>assistant") and whole.startswith(prompt)
    return whole[len(prompt):]


def run_reply(tokenizer, reply: str, max_tokens: int = 1000,
              offered: tuple[str, ...] = ("get_weather",)) -> tuple[str, str, list, str]:
    """(content, reasoning, tool-call pieces, finish reason) of the reply through the output stage, EOS being
    gpt-oss's <|return|> and <|call|>, the request offering `offered`."""
    return stream_reply(tokenizer, "<|start|>assistant", reply, ("<|return|>", "<|call|>"), "openai_gptoss",
                        max_tokens, offered)


def test_the_template_implies_the_harmony_parser(template, tokenizer):
    assert detect_parser(template, render_chat(tokenizer, None, [USER])) == "openai_gptoss"


def test_analysis_is_reasoning_and_final_is_content(tokenizer):
    thinking, answer = "The user asks about Paris. <think> is not a tag here.", "It is sunny, 21 °C, in Paris."
    reply = reply_to(tokenizer, [USER, {"role": "assistant", "thinking": thinking, "content": answer}])
    assert reply.startswith("<|channel|>analysis<|message|>") and reply.endswith("<|return|>")
    assert run_reply(tokenizer, reply) == (answer, thinking, [], "stop")


def test_a_call_to_a_function_is_a_tool_call_with_its_arguments(tokenizer):
    arguments = {"location": "Paris, France", "unit": "celsius"}
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
    turn = {"role": "assistant", "thinking": "I need the weather tool.", "tool_calls": [call]}
    reply = reply_to(tokenizer, [USER, turn, {"role": "tool", "content": "sunny"}], [WEATHER])
    reply = reply[: reply.index("<|call|>") + len("<|call|>")]  # the model's turn ends at its call
    assert "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>" in reply
    content, reasoning, pieces, finish = run_reply(tokenizer, reply)
    assert (content, reasoning, finish) == ("", "I need the weather tool.", "stop")
    [got] = calls_from_deltas(pieces)
    assert (got.name, got.arguments, got.id.startswith("call_")) == ("get_weather", arguments, True)


def test_the_recipient_after_the_channel_and_a_constrain_token(tokenizer):
    """The other header harmony allows (OpenAI's format guide): `<|channel|>commentary to=functions.NAME
    <|constrain|>json<|message|>`, after a preamble on commentary, which the user sees."""
    reply = ("<|channel|>commentary<|message|>Checking the weather.<|end|><|start|>assistant<|channel|>commentary "
             'to=functions.get_weather <|constrain|>json<|message|>{"location": "Oslo"}<|call|>')
    content, reasoning, pieces, _ = run_reply(tokenizer, reply)
    [got] = calls_from_deltas(pieces)
    assert (content, reasoning, got.name, got.arguments) == ("Checking the weather.", "", "get_weather",
                                                              {"location": "Oslo"})


CALL = ("<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.get_weather <|constrain|>json<|message|>{"location": "Oslo"}<|call|>')


@pytest.mark.parametrize("offered", [(), ("get_time",)])
def test_a_call_to_a_function_the_request_did_not_offer_is_no_tool_call(tokenizer, offered):
    """No tools (or tool_choice "none"), or others than the one called: the message is reasoning, as one to a
    built-in tool we do not run is, and the preamble stays content."""
    content, reasoning, pieces, _ = run_reply(tokenizer, CALL, offered=offered)
    assert (content, reasoning, calls_from_deltas(pieces)) == ("Checking.", '{"location": "Oslo"}', [])


@pytest.mark.parametrize("max_tokens", [1, 2, 3])
def test_a_reply_cut_inside_its_first_header_gives_none_of_it(tokenizer, max_tokens):
    assert run_reply(tokenizer, "<|channel|>analysis<|message|>Thinking", max_tokens=max_tokens)[:2] == ("", "")


def test_a_reply_cut_short_keeps_what_it_had(tokenizer):
    reply = reply_to(tokenizer, [USER, {"role": "assistant", "thinking": "Let me think it over", "content": "x"}])
    content, reasoning, _, finish = run_reply(tokenizer, reply, max_tokens=20)
    assert (content, finish) == ("", "length") and "Let me think it over".startswith(reasoning) and reasoning


def test_every_cut_of_a_stream_gives_the_whole_split():
    reply = ("<|channel|>analysis<|message|>a <|ch b<|end|><|start|>assistant<|channel|>final<|message|>ok <| "
             "done")
    whole = HarmonySplitter().feed(reply, final=True)
    assert whole == ("ok <| done", "a <|ch b")
    for cut in range(len(reply) + 1):
        assert split_at(HarmonySplitter(), reply, cut) == whole, cut


def test_plain_text_with_no_message_is_content():
    """A model that ignores the format (or a reply cut inside its first header) still shows its text."""
    assert HarmonySplitter().feed("just words", final=True) == ("just words", "")


def test_reasoning_effort_reaches_the_template(tokenizer):
    prompt = render_chat(tokenizer, None, [USER], template_kwargs=template_variables(None, "high"))
    assert "Reasoning: high" in prompt and "Reasoning: medium" in render_chat(tokenizer, None, [USER])
    assert template_variables({"reasoning_effort": "low"}, "high") == {"reasoning_effort": "low"}
    assert template_variables(None, None) is None

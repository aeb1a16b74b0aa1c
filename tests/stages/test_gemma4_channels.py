"""Gemma 4's replies split into content, reasoning and tool calls (stages/gemma4_channels.py), with Google's chat
template as llama.cpp ships it for the reference: an assistant turn the template renders (its thinking and tool call,
or its answer) is fed back as the model's reply, token by token through the output stage, and must come out as the
fields it was rendered from. The tokenizer is a real byte-level BPE with Gemma 4's control tokens as special tokens,
as Gemma 4's vocabulary has them."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferplug.chat_template import render_chat, template_variables
from inferplug.frontend.tool_calls import calls_from_deltas
from inferplug.stages.gemma4_channels import Gemma4Splitter, arguments_json
from inferplug.stages.reasoning import detect_parser
from tests.stages.reply_stream import split_at, stream_reply

TEMPLATE = Path(__file__).resolve().parents[2] / ".venv" / "llama.cpp" / "models" / "templates" / \
    "google-gemma-4-31B-it.jinja"
CONTROL = ["<bos>", "<|turn>", "<turn|>", "<|channel>", "<channel|>", "<|tool>", "<tool|>", "<|tool_call>",
           "<tool_call|>", "<|tool_response>", "<tool_response|>", '<|"|>']
ENDS = ("<turn|>", "<|tool_response>")  # models/families/gemma4.py end_tokens
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": {"type": "object",
                                                           "properties": {"location": {"type": "string"},
                                                                          "days": {"type": "integer"}}}}}
USER = {"role": "user", "content": "What is the weather in Paris?"}


@pytest.fixture(scope="module")
def tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if not TEMPLATE.is_file():
        pytest.fail(f"{TEMPLATE} is missing: `make setup` fetches it (tests/fixtures/fetch_llama_cpp_converter.py)")
    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(CONTROL)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<turn|>",
                                   chat_template=TEMPLATE.read_text())


def reply_to(tokenizer, messages: list[dict], tools: list[dict] | None = None, **kwargs) -> str:
    """The model's side of the last turn as the template renders it: the chat rendered whole (no generation prompt)
    less the prompt that asks for that turn, which ends at `<|turn>model\\n` (thinking on)."""
    prompt = render_chat(tokenizer, None, [USER], tools, template_kwargs={"enable_thinking": True, **kwargs})
    whole = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=False,
                                          enable_thinking=True)
    assert prompt.endswith("<|turn>model\n") and whole.startswith(prompt)
    return whole[len(prompt):]


def run_reply(tokenizer, reply: str) -> tuple[str, str, list, str]:
    """(content, reasoning, tool-call pieces, finish reason) of the reply through the output stage."""
    return stream_reply(tokenizer, "<|turn>model\n", reply, ENDS, "gemma4", offered=("get_weather",))


def test_the_template_implies_the_gemma4_parser(tokenizer):
    assert detect_parser(TEMPLATE.read_text(), render_chat(tokenizer, None, [USER])) == "gemma4"


def test_thinking_off_closes_an_empty_channel_in_the_prompt(tokenizer):
    """The template's own switch, through chat_template_kwargs: off (its default) the prompt holds an empty thought."""
    assert render_chat(tokenizer, None, [USER]).endswith("<|turn>model\n<|channel>thought\n<channel|>")
    on = render_chat(tokenizer, None, [USER], template_kwargs=template_variables({"enable_thinking": True}, None))
    assert on.endswith("<|turn>model\n")


def test_a_thought_and_a_call_are_reasoning_and_a_tool_call(tokenizer):
    arguments = {"location": "Paris, \"France\"", "days": 3}
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
    turn = {"role": "assistant", "reasoning_content": "I need the weather tool.", "tool_calls": [call]}
    reply = reply_to(tokenizer, [USER, turn], [WEATHER])
    assert reply.startswith("<|channel>thought\n") and reply.endswith("<tool_call|><|tool_response>")
    content, reasoning, pieces, finish = run_reply(tokenizer, reply)
    assert (content, reasoning, finish) == ("", "I need the weather tool.", "stop")
    [got] = calls_from_deltas(pieces)
    assert (got.name, got.arguments, got.id.startswith("call_")) == ("get_weather", arguments, True)


def test_an_answer_is_content(tokenizer):
    reply = reply_to(tokenizer, [USER, {"role": "assistant", "content": "It is sunny in Paris."}])
    assert run_reply(tokenizer, reply) == ("It is sunny in Paris.", "", [], "stop")


def test_every_cut_of_a_stream_gives_the_whole_split():
    reply = '<|channel>thought\nhmm <|ch\n\n<channel|>ok <| <|tool_call>call:f{a:<|"|>x, y<|"|>,b:[1,true]}<tool_call|>'
    whole = Gemma4Splitter(frozenset({"f"})).feed(reply, final=True)
    assert whole == ("ok <| ", "hmm <|ch\n")
    for cut in range(len(reply) + 1):
        splitter = Gemma4Splitter(frozenset({"f"}))
        assert split_at(splitter, reply, cut) == whole, cut
        [call] = calls_from_deltas(splitter.take_calls())
        assert (call.name, call.arguments) == ("f", {"a": "x, y", "b": [1, True]}), cut


def test_gemma_arguments_read_as_json():
    assert arguments_json('{city:<|"|>Oslo: "north"<|"|>,n:-2.5e3,ok:false,none:null,tags:[<|"|>a<|"|>],o:{k:1}}') == \
        '{"city":"Oslo: \\"north\\"","n":-2.5e3,"ok":false,"none":null,"tags":["a"],"o":{"k":1}}'


def test_a_call_to_a_function_the_request_did_not_offer_is_kept_as_text():
    text = '<|tool_call>call:launch{n:1}<tool_call|>'
    splitter = Gemma4Splitter(frozenset({"get_weather"}))
    assert splitter.feed(text, final=True) == (text, "") and splitter.take_calls() == []


def test_a_call_that_does_not_read_is_kept_as_text():
    """A malformed call (a model's slip) is not lost: it is content, as written."""
    text = "<|tool_call>call:f{a:<|\"|>open}<tool_call|>"
    splitter = Gemma4Splitter()
    assert splitter.feed(text, final=True) == (text, "") and splitter.take_calls() == []

"""langchain-tests standard suites for ChatInferPlug; the integration suite runs the real SmolLM2 model."""

from __future__ import annotations

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_tests.integration_tests import ChatModelIntegrationTests
from langchain_tests.unit_tests import ChatModelUnitTests

from langchain_inferplug import ChatInferPlug


class _Flags:
    @property
    def chat_model_class(self) -> type[ChatInferPlug]:
        return ChatInferPlug

    @property
    def chat_model_params(self) -> dict:
        return {"profile": "smollm2-135m"}

    @property
    def has_tool_choice(self) -> bool:
        return True

    @property
    def structured_output_kwargs(self) -> dict:
        return {"method": "json_schema"}

    @property
    def supports_json_mode(self) -> bool:
        return True

    @property
    def returns_usage_metadata(self) -> bool:
        return True


class TestChatInferPlugUnit(_Flags, ChatModelUnitTests):
    pass


@pytest.mark.smollm2
@pytest.mark.slow
class TestChatInferPlugIntegration(_Flags, ChatModelIntegrationTests):
    @property
    def chat_model_params(self) -> dict:
        # Greedy, with the unit suite's standard max_tokens, on every model this suite builds: its standard
        # params are empty (and test_stop_sequence builds from these alone), so the profile's sampling
        # (temperature 0.7, unseeded) would make answers vary from run to run.
        return {**super().chat_model_params, "temperature": 0, "max_tokens": 100}

    @pytest.mark.parametrize("model", [{}, {"output_version": "v1"}], indirect=True)
    @pytest.mark.xfail(strict=True,
                       reason="model limit (reproduced alone, outside the suite): with tool_choice='auto' SmolLM2-135M "
                              "answers 'What is the weather in San Francisco, CA?' in prose ('...a high of 88°F "
                              "(32°C) and a low of 61°F (18°C).', 50 tokens, greedy) instead of calling get_weather; "
                              "a required call is constrained and passes test_tool_calling")
    def test_agent_loop(self, model: BaseChatModel) -> None:
        super().test_agent_loop(model)

    @pytest.mark.xfail(strict=False,
                       reason="model limit at a near-tie (reproduced alone, outside the suite): SmolLM2-135M's forced "
                              "call keeps customer_name='你好啊集团', then after '...a customer with Unicode name' its "
                              "grammar-allowed choices '.' and '.\"' score within 0.1-0.15 of each other (greedy). "
                              "Which wins moves with the kernels' rounding (the prompt GEMM's dtype, the attention's "
                              "exp, the ISA): '.\"' closes the call after 53 tokens; '.' makes 'description' loop "
                              "('This company is a Chinese technology company that...') to max_tokens, so the call "
                              "comes back cut short (finish_reason 'length', its partial arguments in "
                              "invalid_tool_calls, as ChatOpenAI gives a cut call) and tool_calls is empty")
    def test_unicode_tool_call_integration(self, model: BaseChatModel, **kwargs) -> None:
        super().test_unicode_tool_call_integration(model, **kwargs)

"""with_structured_output for ChatInferPlug: constrained decoding to the schema's JSON.

A backend without constrained decoding is refused by the request builder (naming the backend),
so the output is never validated and retried here.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any

from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser
from langchain_core.output_parsers.openai_tools import JsonOutputKeyToolsParser, PydanticToolsParser
from langchain_core.runnables import Runnable, RunnableMap, RunnablePassthrough
from langchain_core.utils.function_calling import convert_to_json_schema, convert_to_openai_tool
from langchain_core.utils.pydantic import is_basemodel_subclass

def _is_pydantic(schema: Any) -> bool:
    return isinstance(schema, type) and is_basemodel_subclass(schema)  # pydantic v2 or v1 models


def structured_output_runnable(model: Any, schema: Any, *, method: str, include_raw: bool,
                               **kwargs: Any) -> Runnable:
    if schema is None and method != "json_mode":
        raise ValueError("with_structured_output needs a schema: a pydantic class, TypedDict or JSON schema dict "
                         "(only method='json_mode' takes none)")
    kwargs.pop("strict", None)  # constrained decoding is always strict; strict output also satisfies strict=False
    if kwargs:
        raise ValueError(f"unsupported with_structured_output arguments {sorted(kwargs)}")
    if method == "function_calling":
        tool = convert_to_openai_tool(schema)
        name = tool["function"]["name"]
        llm = model.bind_tools([schema], tool_choice=name,
                               ls_structured_output_format={"kwargs": {"method": method}, "schema": tool})
        parser: Runnable = (PydanticToolsParser(tools=[schema], first_tool_only=True) if _is_pydantic(schema)
                            else JsonOutputKeyToolsParser(key_name=name, first_tool_only=True))
    elif method in ("json_schema", "json_mode"):
        # json_mode with a schema at hand: constrain to it too (a bare {"type": "object"} lets keys go missing)
        target = {"type": "object"} if schema is None else convert_to_json_schema(schema)
        traced = {"kwargs": {"method": method}, "schema": target}
        # the request builder adds the constrained output's repetition penalty, as for every front end
        llm = model.bind(json_schema=target, ls_structured_output_format=traced)
        parser = PydanticOutputParser(pydantic_object=schema) if _is_pydantic(schema) else JsonOutputParser()
    else:
        raise ValueError(f"method={method!r} is not supported; use 'json_schema', 'function_calling' or 'json_mode'")
    if not include_raw:
        return llm | parser
    parsed = RunnablePassthrough.assign(parsed=itemgetter("raw") | parser, parsing_error=lambda _: None)
    failed = RunnablePassthrough.assign(parsed=lambda _: None)
    return RunnableMap(raw=llm) | parsed.with_fallbacks([failed], exception_key="parsing_error")


"""OpenAI tool calling: `tools` and `tool_choice` in, `message.tool_calls` out.

    request.py   the request's tools, tool_choice and parallel_tool_calls, checked (ToolRequest);
                 assistant `tool_calls` and `role: "tool"` messages of the history
    formats/     one module per call format a model writes (hermes, llama3_json, pythonic, gemma, harmony,
                 mistral, mistral_v11):
                 its parser (model text -> content and calls), its prompt for chat templates that
                 take no tools, and its grammar for tool_choice required / a named function
    prompt.py    the conversation as the chat template gets it (tools=, or the format's prompt)
    stream.py    a choice's text pieces -> content and tool-call deltas (streamed or collected)

A call is held back until it is complete and parses, then sent as two deltas (its id and name,
then its arguments), so a stream never carries a call that the non-streamed answer would not.
"""

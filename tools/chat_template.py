"""Chat templates for tools/preprocess_data.py's instruction datasets: render, tokenize, mask the loss.

* **Rendering.** The tokenizer's own template (``chat_template.jinja``, else
  ``tokenizer_config.json``'s ``chat_template``, transformers' order), else ``--prompt-type``'s
  built-in one, in a Jinja2 environment set up as transformers' ``apply_chat_template`` (sandboxed,
  same extensions, filters, globals and variables, special tokens, extra kwargs such as
  ``enable_thinking``).
* **Tokenizing.** The text is encoded in one piece without added special tokens, as
  ``apply_chat_template(tokenize=True)`` does with a fast tokenizer, so the ids are transformers'.
* **Loss mask.** A token is in the loss when its character span overlaps an assistant turn: after the
  prompt type's ``marker`` through its ``end`` token (a newline after it excluded). What the
  generation prompt writes after the marker (Qwen3's empty ``<think>`` block) is prompt. The turns
  found must equal the assistant messages, else :class:`RecordError`.

Template or tokenizer problems raise :class:`ChatTemplateError`; messages are one line. Needs
``jinja2`` and ``tokenizers``, not transformers.
"""
from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Optional

IGNORE_INDEX = -100
CONFIG_FILE = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"
SPECIAL_TOKEN_NAMES = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class ChatTemplateError(Exception):
    """The template or the tokenizer cannot build this dataset at all (one line)."""


class RecordError(Exception):
    """One conversation cannot be rendered or masked (one line; a bad record)."""


# Built-in templates ------------------------------------------------------------------------------

# Qwen3's published chat template (the model's tokenizer_config.json), with its thinking logic:
# assistant turns after the last user query carry a <think> block, and the generation prompt is
# followed by an empty one when enable_thinking is false.
QWEN3_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""

# ChatML turns; tool calls as <tool_call> JSON, tool results as <tool_response> user turns.
# ``default_system`` is spliced in below: Qwen2.5-style ("qwen") or none ("chatml").
_CHATML_TEMPLATE = r"""{%- if messages and messages[0].role == 'system' %}
    {%- set system = messages[0].content %}
    {%- set turns = messages[1:] %}
{%- else %}
    {%- set system = DEFAULT_SYSTEM %}
    {%- set turns = messages %}
{%- endif %}
{%- if system or tools %}
    {{- '<|im_start|>system\n' + (system or '') }}
    {%- if tools %}
        {{- ('\n\n' if system else '') + '# Tools\n\nYou may call one or more functions. Their signatures, one JSON object per line:\n<tools>' }}
        {%- for tool in tools %}
            {{- '\n' + (tool | tojson) }}
        {%- endfor %}
        {{- '\n</tools>\n\nFor each call, answer with a JSON object within <tool_call></tool_call> tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>' }}
    {%- endif %}
    {{- '<|im_end|>\n' }}
{%- endif %}
{%- for message in turns %}
    {%- set content = message.content if message.content is string else '' %}
    {%- if message.role == 'assistant' %}
        {{- '<|im_start|>assistant\n' + content }}
        {%- for call in message.tool_calls or [] %}
            {%- set call = call.function if call.function is defined else call %}
            {{- ('\n' if content or not loop.first else '') + '<tool_call>\n' }}
            {{- {'name': call.name, 'arguments': call.arguments} | tojson }}
            {{- '\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == 'tool' %}
        {{- '<|im_start|>user\n<tool_response>\n' + content + '\n</tool_response><|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}"""

QWEN_TEMPLATE = _CHATML_TEMPLATE.replace("DEFAULT_SYSTEM", "'You are a helpful assistant.'")
CHATML_TEMPLATE = _CHATML_TEMPLATE.replace("DEFAULT_SYSTEM", "''")

_NO_TOOLS = ("{%- if tools or messages | selectattr('tool_calls', 'defined') | list %}"
             "{{- raise_exception('tool calls need the model\\'s own chat template') }}{%- endif %}\n")

# DeepSeek-V3's turn markers; the system prompt comes first, after the BOS token.
DEEPSEEK3_TEMPLATE = _NO_TOOLS + r"""{{- bos_token if bos_token is defined else '' }}
{%- for message in messages %}
    {%- if message.role == 'system' %}
        {{- message.content }}
    {%- elif message.role == 'user' %}
        {{- '<｜User｜>' + message.content }}
    {%- elif message.role == 'assistant' %}
        {{- '<｜Assistant｜>' + message.content + '<｜end▁of▁sentence｜>' }}
    {%- else %}
        {{- raise_exception('role ' + message.role + ' has no place in the deepseek3 template') }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<｜Assistant｜>' }}
{%- endif %}"""

# Llama 3's header-delimited turns; contents are trimmed as Llama 3's own template trims them.
LLAMA3_TEMPLATE = _NO_TOOLS + r"""{{- bos_token if bos_token is defined else '' }}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message.role + '<|end_header_id|>\n\n' + (message.content | trim) + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}"""


@dataclass(frozen=True)
class PromptType:
    """MindSpeed-LLM's ``--prompt-type``: where assistant turns start and end, and our template."""

    name: str
    marker: str  # the text that opens an assistant turn; the loss starts after it
    end: str  # the token that closes an assistant turn; the loss ends with it
    tokens: tuple  # special tokens the markers are made of: the vocabulary must hold them
    builtin: str  # the template used when the tokenizer has none


_IM = ("<|im_start|>", "<|im_end|>")
PROMPT_TYPES = {
    "qwen3": PromptType("qwen3", "<|im_start|>assistant\n", "<|im_end|>", _IM, QWEN3_TEMPLATE),
    "qwen": PromptType("qwen", "<|im_start|>assistant\n", "<|im_end|>", _IM, QWEN_TEMPLATE),
    "chatml": PromptType("chatml", "<|im_start|>assistant\n", "<|im_end|>", _IM, CHATML_TEMPLATE),
    "deepseek3": PromptType("deepseek3", "<｜Assistant｜>", "<｜end▁of▁sentence｜>",
                            ("<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>"), DEEPSEEK3_TEMPLATE),
    "llama3": PromptType("llama3", "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>",
                         ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"), LLAMA3_TEMPLATE),
}


def prompt_type(name: str) -> PromptType:
    if name not in PROMPT_TYPES:
        raise ChatTemplateError(f"--prompt-type {name}: not one of {', '.join(PROMPT_TYPES)}")
    return PROMPT_TYPES[name]


# The Jinja2 environment ----------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _environment():
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(Extension):
        """``{% generation %}...{% endgeneration %}`` (transformers' assistant-mask tag): renders its body."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    class Namespace(jinja2.utils.Namespace):
        """``namespace()`` that refuses underscore attributes (no reaching into Python internals)."""

        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"a namespace attribute may not start with '_': {name!r}")

    class Dict:
        """``dict(...)`` and ``dict.fromkeys(...)`` without the type itself."""

        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationBlock, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now, dict=Dict(), namespace=Namespace)
    return env


@functools.lru_cache(maxsize=16)
def compile_template(text: str):
    import jinja2

    try:
        return _environment().from_string(text)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"the chat template does not compile: {exc.message} (line {exc.lineno})") from exc


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def normalize_messages(messages: list) -> list:
    """What transformers hands the template: None-valued keys dropped, reasoning under every name templates read."""
    out = []
    for message in messages:
        message = {key: value for key, value in message.items() if value is not None}
        reasoning = next((message[k] for k in REASONING_FIELDS if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


# Where the template comes from ---------------------------------------------------------------------

@dataclass(frozen=True)
class TemplateSource:
    text: str
    source: str  # "chat_template.jinja", "tokenizer_config.json" or "built-in <type>"

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()


def tokenizer_directory(path) -> Optional[Path]:
    """The directory of a tokenizer given as a directory or as its tokenizer.json."""
    if path is None:
        return None
    p = Path(path)
    return p if p.is_dir() else p.parent


def read_config(directory: Optional[Path]) -> dict:
    path = directory / CONFIG_FILE if directory is not None else None
    if path is None or not path.is_file():
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError) as exc:
        raise ChatTemplateError(f"{path}: cannot read: {_one_line(exc)}") from exc
    return config if isinstance(config, dict) else {}


def find_template(directory: Optional[Path], kind: PromptType) -> TemplateSource:
    """The tokenizer's own template (chat_template.jinja, then tokenizer_config.json), else the built-in one."""
    if directory is not None and (directory / TEMPLATE_FILE).is_file():
        return TemplateSource((directory / TEMPLATE_FILE).read_text(encoding="utf-8"), TEMPLATE_FILE)
    template = read_config(directory).get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if isinstance(template, str) and template.strip():
        return TemplateSource(template, CONFIG_FILE)
    return TemplateSource(kind.builtin, f"built-in {kind.name}")


def special_token_variables(config: dict) -> dict:
    """``bos_token``, ``eos_token``, ... as transformers passes them to templates (only those the config names)."""
    out = {}
    for name in SPECIAL_TOKEN_NAMES:
        value = config.get(f"{name}_token")
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            out[f"{name}_token"] = value
    return out


# Rendering, tokenizing, masking --------------------------------------------------------------------

PROBE = [{"role": "system", "content": "S"}, {"role": "user", "content": "U1"},
         {"role": "assistant", "content": "A1"}, {"role": "user", "content": "U2"},
         {"role": "assistant", "content": "A2"}]


class ChatRenderer:
    """Render conversations with one template and encode them into ids and labels.

    ``tokenizer``: a ``tokenizers.Tokenizer``; ``directory``: where its tokenizer_config.json and
    chat_template.jinja live (None: built-in template, no special-token variables);
    ``template_kwargs``: extra variables (``enable_thinking``, ...), passed only when given.
    """

    def __init__(self, tokenizer, directory, kind: PromptType, template_kwargs: Optional[dict] = None,
                 template: Optional[TemplateSource] = None) -> None:
        self.tokenizer = tokenizer
        self.kind = kind
        self.directory = tokenizer_directory(directory)
        self.template = template or find_template(self.directory, kind)
        self.variables = {**special_token_variables(read_config(self.directory)), **(template_kwargs or {})}
        self._compiled = compile_template(self.template.text)
        self._check_tokens()
        self._check_markers()
        self.generation_suffix = self._generation_suffix()

    # Setup checks -----------------------------------------------------------------------------
    def _check_tokens(self) -> None:
        missing = [t for t in self.kind.tokens if self.tokenizer.token_to_id(t) is None]
        if missing:
            raise ChatTemplateError(
                f"--prompt-type {self.kind.name} ({self.template.source} template) needs the special token(s) "
                f"{', '.join(missing)}, which the tokenizer's vocabulary lacks; choose the --prompt-type of "
                f"this tokenizer's model")

    def _probe(self, messages, add_generation_prompt: bool) -> str:
        try:
            return self.render(messages, add_generation_prompt=add_generation_prompt)
        except RecordError as exc:
            raise ChatTemplateError(f"the {self.template.source} chat template fails on a plain user/assistant "
                                    f"conversation: {exc}") from None

    def _check_markers(self) -> None:
        try:
            text = self.render(PROBE)
        except RecordError:  # some templates refuse a system turn; the rest of the data may have none
            text = self._probe(PROBE[1:], False)
        found = self._spans(text, check_suffix=False)
        if len(found) != 2:
            raise ChatTemplateError(
                f"the {self.template.source} chat template does not write --prompt-type {self.kind.name}'s "
                f"assistant turns ({self.kind.marker!r} ... {self.kind.end!r}); choose the --prompt-type that "
                f"matches this tokenizer's model")

    def _generation_suffix(self) -> str:
        """What the generation prompt writes after the marker (e.g. Qwen3's empty think block)."""
        user = [{"role": "user", "content": "U"}]
        without, with_prompt = self._probe(user, False), self._probe(user, True)
        if not with_prompt.startswith(without):
            return ""
        added = with_prompt[len(without):]
        at = added.rfind(self.kind.marker)
        return added[at + len(self.kind.marker):] if at >= 0 else ""

    # Per conversation -------------------------------------------------------------------------
    def render(self, messages: list, tools=None, add_generation_prompt: bool = False) -> str:
        try:
            return self._compiled.render(messages=normalize_messages(messages), tools=tools or None, documents=None,
                                         add_generation_prompt=add_generation_prompt, **self.variables)
        except Exception as exc:  # TemplateError (raise_exception included), TypeError on odd data, ...
            raise RecordError(f"the chat template failed: {_one_line(exc)}") from None

    def _spans(self, text: str, check_suffix: bool = True) -> list:
        """Character spans of the assistant turns' loss: after the marker (and suffix) through the end token."""
        marker, end, suffix = self.kind.marker, self.kind.end, self.generation_suffix if check_suffix else ""
        spans, pos = [], 0
        while (at := text.find(marker, pos)) >= 0:
            start = at + len(marker)
            if suffix and text.startswith(suffix, start):
                start += len(suffix)
            stop = text.find(end, start)
            if stop < 0:
                break
            spans.append((start, stop + len(end)))
            pos = stop + len(end)
        return spans

    def encode_rendered(self, texts: list, n_assistant: list) -> list:
        """``(ids, labels)`` for rendered conversations, or a :class:`RecordError` in place of a bad one."""
        encodings = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        out = []
        for text, encoding, expected in zip(texts, encodings, n_assistant):
            spans = self._spans(text)
            if len(spans) != expected:
                out.append(RecordError(
                    f"the rendered conversation has {len(spans)} assistant turn(s) of --prompt-type "
                    f"{self.kind.name} ({self.kind.marker!r} ... {self.kind.end!r}), the record {expected}"))
                continue
            ids = encoding.ids
            labels = [IGNORE_INDEX] * len(ids)
            k = 0
            for i, (start, stop) in enumerate(encoding.offsets):
                while k < len(spans) and start >= spans[k][1]:
                    k += 1
                if k == len(spans):
                    break
                if stop > spans[k][0]:
                    labels[i] = ids[i]
            out.append((ids, labels))
        return out

    def encode(self, messages: list, tools=None):
        """``(ids, labels)`` of one conversation; raises :class:`RecordError`."""
        n_assistant = sum(1 for m in messages if m.get("role") == "assistant")
        if n_assistant == 0:
            raise RecordError("the conversation has no assistant turn")
        result = self.encode_rendered([self.render(messages, tools)], [n_assistant])[0]
        if isinstance(result, RecordError):
            raise result
        return result


def describe(renderer: ChatRenderer) -> str:
    return f"{renderer.template.source} (sha256 {renderer.template.sha256[:12]})"


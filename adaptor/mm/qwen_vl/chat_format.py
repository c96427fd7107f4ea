"""Qwen's chat format for vision-language training samples: text pieces, each marked loss or not.

The conversation is written the way the published Qwen2.5-VL / Qwen3-VL chat templates write it (and
LLaMA-Factory's ``qwen2vl`` / ``qwen3_vl_nothink`` templates, which MindSpeed-MM uses)::

    <|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n
    <|im_start|>user\\n<|vision_start|><|image_pad|><|vision_end|>Describe<|im_end|>\\n
    <|im_start|>assistant\\nA red circle.<|im_end|>\\n

Qwen2.5-VL's template adds that default system prompt when the conversation has none; Qwen3-VL's adds
nothing. Each ``<image>`` of a user turn becomes one ``<|image_pad|>`` between the vision markers here,
each ``<video>`` one ``<|video_pad|>``; the dataset widens them to the item's token count after tokenizing. The loss covers what the assistant
says: its text, ``<|im_end|>`` and the newline after it (LLaMA-Factory's assistant format), so the model
learns to stop; ``train_on_prompt`` puts everything in the loss, ``mask_history`` only the last reply.
"""
from __future__ import annotations

IMAGE_MARKER, VIDEO_MARKER = "<image>", "<video>"
IMAGE_PAD, VIDEO_PAD = "<|image_pad|>", "<|video_pad|>"
VISION_START, VISION_END = "<|vision_start|>", "<|vision_end|>"
DEFAULT_SYSTEM = {"qwen2vl": "You are a helpful assistant.", "qwen2_vl": "You are a helpful assistant.",
                  "qwen3_vl_nothink": ""}


def _turn(role: str, text: str) -> str:
    return f"<|im_start|>{role}\n{text}<|im_end|>\n"


def render(template: str, system: str | None, turns: list[tuple[str, str]], train_on_prompt: bool = False,
           mask_history: bool = False) -> list[tuple[str, bool]]:
    """(text, in the loss) pieces of a conversation; ``turns`` alternate ("user", text), ("assistant", text).

    The pieces joined are the rendered sample; ``<image>`` / ``<video>`` in user text is already the vision run.
    """
    system = DEFAULT_SYSTEM[template] if system is None else system
    pieces = [(_turn("system", system), train_on_prompt)] if system else []
    last_reply = max(i for i, (role, _) in enumerate(turns) if role == "assistant")
    for index, (role, text) in enumerate(turns):
        if role == "user":
            text = text.replace(IMAGE_MARKER, VISION_START + IMAGE_PAD + VISION_END)
            text = text.replace(VIDEO_MARKER, VISION_START + VIDEO_PAD + VISION_END)
            pieces.append((_turn("user", text) + "<|im_start|>assistant\n", train_on_prompt))
        else:
            in_loss = train_on_prompt or not mask_history or index == last_reply
            pieces.append((f"{text}<|im_end|>\n", in_loss))
    return pieces

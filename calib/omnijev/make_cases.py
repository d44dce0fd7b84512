"""Write ``calib/omnijev/cases.json``: the validation requests for OmniJev-4B v1.1 engines.

Run ``python calib/omnijev/make_cases.py``; the file is generated, never edited by hand. The cases
cover the three kinds, regions (fractional corners included), the options-list and criteria forms
(keys, texts, regions, abstain entries, empty entries), 1 and 255 options, twelve questions of
every kind in one request, questions sharing a long instruction start, trailing whitespace, CJK
and emoji text past the 200-character option cut, and images in each decoded form the reference
accepts (omnijev.md §3.1, §12.1): RGB, RGBA, grayscale, 64-colour palette and 16-bit grayscale
PNG, and a JPEG at quality 90, at sizes below and above the processor's pixel budget. Images are
drawn here from closed-form patterns, so the script writes the same bytes every run.
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

OUT = Path(__file__).with_name("cases.json")
CJK = "东京是日本的首都，人口超过一千万。画面右上角有一个红色的关闭按钮和一个蓝色的保存按钮。"
EMOJI = "Great screen 😀👍 but the parcel 📦 icon is late 🚚 — «très» “annoying” 👩‍💻 🇵🇹!"


def pattern(width: int, height: int, seed: int) -> np.ndarray:
    """uint8 RGB ``[height, width, 3]``: gradients, stripes and a bright box, so every patch differs."""
    y, x = np.mgrid[0:height, 0:width]
    red = (x * 255 // max(width - 1, 1) + seed * 37) % 256
    green = (y * 255 // max(height - 1, 1) + seed * 91) % 256
    blue = ((x // 7 + y // 5) % 2) * 200 + seed % 50
    rgb = np.stack([red, green, blue], axis=-1).astype(np.uint8)
    rgb[height // 4 : height // 2, width // 3 : width // 2] = (250, 240, 30)
    return rgb


def data_url(image: Image.Image, fmt: str, **options: Any) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def images() -> dict[str, str]:
    rgb = pattern(96, 64, 0)
    alpha = (np.arange(120 * 80).reshape(80, 120) % 256).astype(np.uint8)[..., None]
    gray16 = (np.add.outer(np.arange(72), np.arange(100)) * 331 % 65536).astype(np.uint16)
    return {
        "rgb": data_url(Image.fromarray(rgb), "PNG"),
        "rgba": data_url(Image.fromarray(np.concatenate([pattern(120, 80, 1), alpha], axis=-1)), "PNG"),
        "gray": data_url(Image.fromarray(pattern(64, 96, 2)[..., 0]), "PNG"),
        "palette": data_url(Image.fromarray(pattern(128, 72, 3)).quantize(colors=64, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE), "PNG"),
        "gray16": data_url(Image.fromarray(gray16), "PNG"),
        "jpeg": data_url(Image.fromarray(pattern(160, 90, 4)), "JPEG", quality=90),
        "wide": data_url(Image.fromarray(pattern(800, 60, 5)), "PNG"),
        "large": data_url(Image.fromarray(pattern(1000, 700, 6)), "PNG"),  # above 602,112 pixels: resized down
    }


def noul(instructions: str, **extra: Any) -> dict[str, Any]:
    return {"type": "noul", "instructions": instructions, **extra}


def choice(instructions: str, **form: Any) -> dict[str, Any]:
    return {"type": "choice", "instructions": instructions, **form}


def score(instructions: str, **form: Any) -> dict[str, Any]:
    return {"type": "score", "instructions": instructions, **form}


def mixed_twelve() -> dict[str, Any]:
    """Twelve questions of every kind and form, as the reference's speed bench asks about a screen."""
    return {
        "visible": noul("A dialog window is visible."),
        "toolbar": noul("The toolbar is visible.", region={"box": [0, 0, 500, 120.5]}),
        "next": choice("What should the agent do next?", criteria={"click": "press a button", "type": "enter text", "scroll": None, "wait": None}),
        "risk": score("How risky is the next action?", levels=["safe", "check first", "dangerous"]),
        "button": choice("Which control closes the window?", options=[{"key": "close", "text": "the X button"}, {"region": {"box": [10, 10, 40, 30]}}, {"abstain": True}]),
        "theme": choice("Which colour theme is used?", criteria={"dark": None, "light": None}),
        "clutter": score("How cluttered is the screen?", criteria={"calm": "few elements", "busy": None, "chaotic": "overlapping windows"}),
        "error": noul("An error message is shown."),
        "focus": noul("The focused field is empty.", region={"box": [48, 16, 96, 48]}),
        "app": choice("Which application is open?", options=[{"text": "a browser"}, {"text": "a text editor"}, {"text": "a terminal"}, {"key": "other"}]),
        "progress": score("How far along is the task?", levels=[f"{p}%" for p in (0, 25, 50, 75, 100)]),
        "login": noul("The user is logged in."),
    }


def cases() -> list[dict[str, Any]]:
    image = images()
    out: list[tuple[str, str, dict[str, Any]]] = [
        ("golden", "rgb", {
            "noul": noul("The image is mostly blue.", region={"box": [0, 0, 48, 32]}),
            "choice": choice("Which colour dominates?", criteria={"red": None, "green": "Mostly green", "blue": None}),
            "score": score("How bright is the image?", levels=["dark", "medium", "bright"]),
        }),
        ("noul-plain-rgba", "rgba", {"q": noul("The background is transparent.")}),
        ("noul-region-gray", "gray", {"q": noul("This area holds text.", region={"box": [2.5, 3.49, 60.5, 40.51]})}),
        ("noul-region-falsy", "rgb", {"q": noul("Anything here?", region=None), "r": noul("Anything there?", region={})}),
        ("choice-criteria-palette", "palette", {"q": choice("Which shape is highlighted?", criteria={"square": "a yellow square", "circle": None, "none": "nothing is highlighted"})}),
        ("choice-options-jpeg", "jpeg", {"q": choice("Which region shows the error?", options=[
            {"key": "top", "region": {"box": [0, 0, 1000, 120.4]}}, {"text": "the dialog"}, {"abstain": True}, {},
            {"key": "bottom", "text": "the status bar"}, {"abstain": False, "text": "the sidebar"}])}),
        ("choice-one-option", "rgb", {"q": choice("Is this the settings page?", criteria={"settings": None})}),
        ("choice-255-options", "rgb", {"q": choice("Which label fits the image best?", options=[{"key": f"label {i:03d}", "text": f"option number {i}"} for i in range(255)])}),
        ("score-levels-gray16", "gray16", {"q": score("How dark is the image?", levels=["very dark", "dark", "medium", "light", "very light"])}),
        ("score-criteria-two", "rgba", {"q": score("Is the layout usable?", criteria={"no": None, "yes": "buttons are reachable"})}),
        ("mixed-twelve-wide", "wide", mixed_twelve()),
        ("shared-instruction-start", "large", {
            f"q{i}": noul("Look carefully at the whole screenshot, including the corners and the title bar, and answer: " + text)
            for i, text in enumerate(["a window is open.", "a window is minimised.", "the title bar is red."])
        }),
        ("cjk-emoji", "jpeg", {
            "zh": choice(CJK + "哪个按钮是红色的？", criteria={"关闭": "右上角的按钮", "保存": None, "取消": CJK * 4}),
            "emoji": noul(EMOJI),
            "mood": score("How happy is the screen? 😀", levels=["😞", "😐", "😀"]),
        }),
        ("whitespace", "palette", {
            "trail": noul("Is there a menu? \t\n\x1c\x1f"),
            "lead": choice("   Leading spaces stay.", options=[{"text": "  padded option  "}, {"text": "\ttab"}]),
        }),
    ]  # fmt: skip
    return [{"name": name, "request": {"state": {"images": [image[kind]]}, "questions": questions}} for name, kind, questions in out]


def main() -> None:
    data = {"family": "omnijev", "generated_by": "calib/omnijev/make_cases.py", "cases": cases()}
    OUT.write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {len(data['cases'])} cases to {OUT}")


if __name__ == "__main__":
    main()

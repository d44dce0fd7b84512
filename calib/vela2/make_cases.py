"""Write ``calib/vela2/cases.json``: the validation and benchmark requests for the Vela 2.0 decoders.

Run ``python calib/vela2/make_cases.py``; the file is generated, never edited by hand. The cases
cover all five kinds, the presets, windowed long spans, the PII sparse gate on both sides of its K,
CJK and emoji, thresholds at the edges,
255 options and 255 labels, every state form, and the router-signal workload of the benchmarks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

OUT = Path(__file__).with_name("cases.json")

PROSE = (
    "Our refund policy allows returns within 30 days of delivery for unused items. Shipping takes three to "
    "five business days; tracking numbers arrive by e-mail. Dr. Maria García works for the World Health "
    "Organization in Geneva, Switzerland, and can be reached at maria.garcia@who.example.org or +41 22 791 21 11. "
)
CJK = "东京是日本的首都，人口超过一千万。我的名字是李华，电话号码是13800138000，住在上海市浦东新区世纪大道100号。"
EMOJI = "Great service 😀👍 but the parcel 📦 arrived late 🚚 — «très» “annoying” ‘really’ 👩‍💻 🇵🇹!"
GOLDEN_STATE = {
    "request": "Hi, I'm Tom Baker (tom.baker@example.com). What is the maximum daily dose of paracetamol for an adult?",
    "source": "For adults, the maximum dose of paracetamol is 4 grams in 24 hours.",
    "answer": "Adults can take up to 6 grams of paracetamol in 24 hours.",
}
SUBJECTS = ["biology", "business", "chemistry", "computer science", "economics", "engineering", "health",
            "history", "law", "math", "philosophy", "physics", "psychology", "other"]  # fmt: skip


def choice(instructions: str, criteria: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "choice", "instructions": instructions, "criteria": criteria, **extra}


def router_signals(tokens_of_text: int = 600) -> dict[str, Any]:
    """The router-signal request of the benchmarks: six questions, all five kinds, about 600 tokens."""
    text = (PROSE * 8)[: tokens_of_text * 4]
    return {
        "state": {"request": "Can you check whether my refund was processed? " + text},
        "questions": {
            "domain": choice("Which subject area is this request about?", {s: f"questions about {s}" for s in SUBJECTS}),
            "jailbreak": {"type": "noul", "instructions": "Is this a prompt injection or jailbreak attempt?"},
            "urgency": {"type": "score", "instructions": "How urgent is this request?", "criteria": ["Routine", "Soon", "Critical"]},
            "safety": {"type": "set", "instructions": "Which safety concerns apply?",
                       "criteria": {k: None for k in ("violence", "self_harm", "sexual", "hate", "harassment",
                                                      "illegal", "medical", "financial")}},  # fmt: skip
            "pii": {"preset": "pii"},
            "feedback": choice("What kind of feedback is this?", {"positive": None, "negative": None, "neutral": None}),
        },
    }


def cases() -> list[dict[str, Any]]:
    out: list[tuple[str, dict[str, Any]]] = []

    def add(name: str, state: Any, questions: dict[str, Any], **options: Any) -> None:
        out.append((name, {"state": state, "questions": questions, **({"options": options} if options else {})}))

    add("golden", GOLDEN_STATE, {
        "domain": choice("Which subject area is this request about?", {"health": "medicine, clinical practice or nutrition",
                         "math": "arithmetic, algebra or statistics", "other": "a subject that fits none of the listed areas"},
                         over="request"),
        "jailbreak": {"type": "noul", "instructions": "Is this a prompt injection or jailbreak attempt?", "over": "request"},
        "urgency": {"type": "score", "instructions": "How urgent is this request?", "over": "request",
                    "criteria": ["Routine", "Needs prompt attention", "Critical"]},
        "topics": {"type": "set", "instructions": "Which topics does the request mention?", "over": "request",
                   "criteria": {"medication": "drugs or doses", "billing": "payments or invoices"}},
        "pii": {"preset": "pii", "over": "request"},
        "halu": {"preset": "halu"},
    })  # fmt: skip
    add("choice-two", "Please reset my password.", {"q": choice("Which team?", {"support": None, "sales": None})})
    add("choice-255", PROSE, {"q": choice("Which label fits best?", {f"label {i:03d}": f"option number {i}" for i in range(255)})})
    add("choice-list-form", "The invoice total is wrong.", {"q": {"type": "choice", "instructions": "Route it.",
        "choices": [{"key": "billing", "description": "Refund and billing"}, {"key": "shipping"}, {"key": "sales", "description": None}]}})  # fmt: skip
    add("choice-json-instructions", "Book a table for two.", {"q": choice({"task": "classify", "labels": 3}, {"a": {"x": 1}, "b": [1, 2], "c": "text"})})
    add("noul-default", "Please refund the duplicate charge.", {"q": {"type": "noul", "instructions": "Does the customer ask for a refund?"}})
    add("noul-criteria", "I love this product.", {"q": {"type": "noul", "instructions": "Is the review positive?",
        "criteria": {"true": "The review praises the product.", "false": None}}})  # fmt: skip
    add("noul-choices-form", "It rained all day.", {"q": {"type": "noul", "instructions": "Is it about weather?",
        "choices": [{"key": "true", "description": "weather"}]}})  # fmt: skip
    add("score-two", "The server is down for everyone.", {"q": {"type": "score", "instructions": "Severity?", "criteria": ["Low", "High"]}})
    add("score-ten", PROSE, {"q": {"type": "score", "instructions": "Rate clarity.", "levels": [f"level {i}" for i in range(10)]}})
    add("score-json-levels", "A short note.", {"q": {"type": "score", "instructions": "Length?", "criteria": [{"n": 1}, ["two"], "three"]}})
    add("relevance-preset", {"request": "What is the refund window?", "document": PROSE}, {"rel": {"preset": "relevance"}})
    add("set-one-label", "Send me the invoice again.", {"s": {"type": "set", "instructions": "Topics?", "criteria": {"billing": "payments"}}})
    add("set-threshold-zero", "Hello there.", {"s": {"type": "set", "instructions": "Topics?", "criteria": {"a": None, "b": None}, "threshold": 0}})
    add("set-threshold-one", "Hello there.", {"s": {"type": "set", "instructions": "Topics?", "criteria": {"a": None, "b": None}, "threshold": 1}})
    add("set-labels-form", PROSE, {"s": {"type": "set", "instructions": "Which apply?",
        "labels": [{"key": "refund", "description": "refunds"}, {"key": "shipping"}, {"key": "contact", "description": "contact data"}]}})  # fmt: skip
    add("set-255-labels", "Cats and dogs.", {"s": {"type": "set", "instructions": "Which?", "criteria": {f"t{i}": None for i in range(255)}}})
    add("span-router-entities", PROSE, {"e": {"type": "span", "instructions": "Which spans name a place or an organization?",
        "criteria": {"location": "a city, country or address", "organization": "a company or institution"}}})  # fmt: skip
    add("span-broad-explicit", PROSE, {"e": {"type": "span", "instructions": "Mark amounts.", "criteria": {"amount": None}, "head": "broad"}})
    add("span-router-explicit", PROSE, {"e": {"type": "span", "instructions": "Mark amounts.", "criteria": {"amount": None}, "head": "router"}})
    add("span-halu-alias", {"context": "The Eiffel Tower is in Paris.", "answer": "The Eiffel Tower is in Berlin."},
        {"h": {"type": "span", "instructions": "Mark unsupported claims.", "criteria": {"hallucination": "a claim the context does not support"}}})
    add("span-halu-preset", GOLDEN_STATE, {"halu": {"preset": "halu"}})
    add("span-pii-preset-short", "My name is Anna Müller and I am 23.", {"pii": {"preset": "pii"}})
    add("span-pii-labels", PROSE, {"p": {"type": "span", "instructions": "Mark personal data.", "criteria": {"PERSON": None, "EMAIL_ADDRESS": None}}})
    # The PII sparse-document gate on either side of its K = 3 (tiny member, seed 0): both parts are
    # long enough for a length-rule threshold below t_sparse; at the 0.5 probe the first decodes
    # exactly K spans (the gate raises the threshold to t_sparse), the second K + 1 (it does not).
    add("span-pii-sparse-gate-at-k", "zzz zzz zzz " * 36, {"pii": {"preset": "pii"}})
    add("span-pii-sparse-gate-over-k", "zzz zzz zzz " * 44, {"pii": {"preset": "pii"}})
    add("span-threshold-zero", "Alice met Bob.", {"s": {"type": "span", "instructions": "Names?", "criteria": {"n": None}, "threshold": 0}})
    add("span-threshold-one", "Alice met Bob.", {"s": {"type": "span", "instructions": "Names?", "criteria": {"n": None}, "threshold": 1}})
    add("span-over-shared-key", {"notes": "Call Jane at 555-0100.", "history": "Ask Bob about jane@example.com"},
        {"s": {"type": "span", "instructions": "Contacts?", "over": "history", "criteria": {"contact": None}}})
    add("span-255-labels", "Alice met Bob in Lisbon.", {"s": {"type": "span", "instructions": "Tags?", "criteria": {f"L{i}": None for i in range(255)}}})
    add("span-windowed-long", {"request": "Find every contact.", "answer": PROSE * 60},
        {"c": {"type": "span", "instructions": "Mark contact data.", "criteria": {"email": None, "phone": None}}})
    add("span-windowed-pii", PROSE * 45, {"pii": {"preset": "pii"}, "topic": {"type": "noul", "instructions": "About refunds?"}})
    add("several-spans", GOLDEN_STATE, {
        "a": {"type": "span", "instructions": "Names?", "over": "request", "criteria": {"name": None}},
        "b": {"type": "span", "instructions": "Numbers?", "over": "answer", "criteria": {"number": None}},
        "c": {"type": "span", "instructions": "Doses?", "over": "source", "criteria": {"dose": None}},
    })  # fmt: skip
    add("cjk", CJK, {"pii": {"preset": "pii"}, "lang": choice("Which language?", {"chinese": None, "japanese": None, "korean": None})})
    add("cjk-mixed", f"{CJK} こんにちは、田中です。서울특별시 중구 세종대로 110.", {
        "s": {"type": "span", "instructions": "Addresses?", "criteria": {"address": None}}})
    add("emoji", EMOJI, {"s": {"type": "span", "instructions": "Mark emoji.", "criteria": {"emoji": None}},
                         "mood": {"type": "score", "instructions": "Mood?", "criteria": ["bad", "ok", "good"]}})  # fmt: skip
    add("urls-emails-handles", "Visit https://www.example.com/docs?lang=en). Or write to jane.doe+news@mail.example.org, @vela_team.",
        {"s": {"type": "span", "instructions": "Contacts?", "criteria": {"url": None, "email": None, "handle": None}}})
    add("array-state", [{"role": "user", "text": "refund please"}, 42, True, None], {"q": {"type": "noul", "instructions": "Refund?"}})
    add("string-json-state", '  {"prompt": "Hi there", "response": "Hello!"}', {"q": {"type": "noul", "instructions": "Greeting?"}})
    add("unknown-keys", {"user": "Help me", "ticket": {"id": 7, "tags": ["a"]}, "Answer": "Sure"},
        {"q": {"type": "choice", "instructions": "Resolved?", "criteria": {"yes": None, "no": None}, "over": ["user", "answer"]}})
    add("mixed-invalid", "Please refund the duplicate charge.", {
        "ok": {"type": "noul", "instructions": "Refund?"},
        "bad": {"type": "noul", "instructions": " "},
        "few": {"type": "choice", "instructions": "x", "criteria": {"one": None}},
        "set": {"type": "set", "instructions": "Which?", "criteria": {"a": None}},
        "set.a": {"type": "noul", "instructions": "collides with the set's label answer"},
    })  # fmt: skip
    add("all-kinds-one-row", GOLDEN_STATE, {
        "c": choice("Topic?", {"medicine": None, "travel": None}),
        "n": {"type": "noul", "instructions": "Is the answer correct?"},
        "s": {"type": "score", "instructions": "Confidence?", "criteria": ["low", "mid", "high"]},
        "t": {"type": "set", "instructions": "Topics?", "criteria": {"dose": None, "age": None}},
        "p": {"type": "span", "instructions": "Numbers?", "criteria": {"number": None}},
    })  # fmt: skip
    add("scan-budget", {"request": "short", "context": PROSE * 4}, {
        "a": {"type": "noul", "instructions": "Long context?", "over": "context"},
        "b": {"type": "noul", "instructions": "Short request?", "over": "request"},
    }, max_tokens=64)  # fmt: skip
    add("router-signals-600", **router_signals())
    add("prefix-one-token", "a", {"q": {"type": "noul", "instructions": "Is this a letter?"}})
    return [{"name": name, "request": request} for name, request in out]


def main() -> None:
    data = {"family": "vela2", "generated_by": "calib/vela2/make_cases.py", "cases": cases()}
    OUT.write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {len(data['cases'])} cases to {OUT}")


if __name__ == "__main__":
    main()

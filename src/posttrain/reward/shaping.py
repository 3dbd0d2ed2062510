"""Shaping rewards for the arithmetic task, usable as ``reward.functions`` entries.

Both are meant to go with the ``exact`` verifier, which scores a right answer 1 and everything
else 0, and they return 0 where it scores 1, so the verifier alone decides the top of the scale.
:func:`numeric_closeness` adds a little credit for being close (from random weights a right
answer is a needle in a haystack); :func:`unmarked_answer_credit` pays half for a right answer
stated in prose instead of the asked-for box.
"""

from __future__ import annotations

from posttrain.reward.extract import extract_answer, last_number, marked_answer


def numeric_closeness(prompt: str, completion: str, answer: str, meta: dict) -> float:
    """0.1 for a well-formed integer, plus up to 0.2 the closer it is (within 10) to the answer.

    An exact answer gets 0 here (the verifier already gives it 1), so the total reward is 1 for
    right, at most 0.3 for nearly right, 0 for malformed.
    """
    text = extract_answer(completion)
    if text == answer.strip():
        return 0.0
    try:
        value, gold = int(text), int(answer)
    except ValueError:
        return 0.0
    return 0.1 + 0.2 * max(0.0, 1.0 - abs(value - gold) / 10.0)


#: What :func:`unmarked_answer_credit` pays: half of what a right, boxed answer earns.
UNMARKED_CREDIT = 0.5


def unmarked_answer_credit(prompt: str, completion: str, answer: str, meta: dict) -> float:
    """0.5 when the completion marks no answer but the last number it writes is the right one.

    The format as a multiplier of correctness: a right answer in the asked-for box earns 1 (from
    the verifier), a right answer stated in prose earns half, and anything wrong earns nothing,
    boxed or not. A flat format credit instead pays any box, and a weak policy that rarely
    computes the answer collapses onto boxing whatever is easiest to copy (an example in the
    prompt, an operand). Returns 0 when ``exact`` already scores the completion (its first line is
    the answer), so nothing is paid twice; with ``last_number`` or ``math`` a right answer in
    prose would be paid by the verifier as well. Measured on SmolLM2-135M
    (docs/guides/smollm2.md): its boxes were right less often than its prose, so this reward
    taught it to stop boxing.
    """
    if marked_answer(completion) is not None or extract_answer(completion) == answer.strip():
        return 0.0
    return UNMARKED_CREDIT if last_number(completion) == answer.strip() else 0.0


def matching_chars(text: str, target: str) -> int:
    """How many of ``text``'s characters equal ``target``'s at the same position (the count
    every positional copy credit is built on)."""
    return sum(a == b for a, b in zip(text, target, strict=False))


def digit_match(prompt: str, completion: str, answer: str, meta: dict) -> float:
    """0.1 for a well-formed integer, plus up to 0.2 for the share of the answer's digits it
    writes right, position by position from the left (extra or missing digits count as wrong).

    Denser than :func:`numeric_closeness` for long answers: copying ``579`` digit by digit (or
    getting its first digit right) earns credit before the whole number does. An exact answer
    gets 0 here (the verifier gives it 1), so the total is 1 for right, below 0.3 otherwise.
    """
    text = extract_answer(completion)
    gold = answer.strip()
    if text == gold:
        return 0.0
    try:
        int(text)
    except ValueError:
        return 0.0
    return 0.1 + 0.2 * matching_chars(text, gold) / max(len(text), len(gold))

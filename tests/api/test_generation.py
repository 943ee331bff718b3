"""Stop strings are cut exactly, wherever the token boundaries fall."""

from __future__ import annotations

import pytest

from wicore.api.generation import StopMatcher


def feed(stops: tuple[str, ...], pieces: list[str]) -> tuple[list[str], bool]:
    m = StopMatcher(stops)
    sent = []
    for piece in pieces:
        out, stopped = m.push(piece)
        sent.append(out)
        if stopped:
            return sent, True
    sent.append(m.flush())
    return sent, False


def test_no_stops_passes_text_through():
    assert feed((), ["a", "b"]) == (["a", "b", ""], False)


def test_stop_split_across_pieces_is_held_then_cut():
    sent, stopped = feed(("END",), ["abc E", "N", "D tail"])
    assert stopped and "".join(sent) == "abc " and sent == ["abc ", "", ""]


def test_held_text_that_is_not_a_stop_is_released():
    sent, stopped = feed(("END",), ["xE", "Nx", "y"])
    assert not stopped and sent == ["x", "ENx", "y", ""]


def test_earliest_of_several_stops_wins():
    sent, stopped = feed(("cd", "b"), ["abcd"])
    assert stopped and sent == ["a"]


def test_held_prefix_released_at_the_end():
    sent, stopped = feed(("END",), ["x", "EN"])
    assert not stopped and "".join(sent) == "xEN"


@pytest.mark.parametrize("cut", range(1, 9))
def test_any_split_of_the_text(cut):
    text = "hello STOP world"
    sent, stopped = feed(("STOP",), [text[:cut], text[cut:]])
    assert stopped and "".join(sent) == "hello "

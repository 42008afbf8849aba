"""vidlora.visible: what a name holds that a reader cannot see is shown, and flagged."""

from vidlora.visible import visible, warning


def test_bidi_and_zero_width_characters_are_shown_as_marks():
    assert visible("report\u202efdp.mp4") == "report[U+202E]fdp.mp4"
    assert visible("ad\u200bmin") == "ad[U+200B]min"
    assert visible("\u2067x\u2069 \ufeffy") == "[U+2067]x[U+2069] [U+FEFF]y"
    assert visible("Grabung Süd, 墓室 2.mp4") == "Grabung Süd, 墓室 2.mp4"  # letters of any script stay


def test_an_export_flags_the_names_that_hold_them():
    assert warning("report\u202efdp\u202e.mp4") == "holds invisible or direction-changing characters: [U+202E]"
    assert warning("plain.mp4") is None and warning(None) is None

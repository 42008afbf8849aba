"""vidlora.reasons: reason codes read as sentences (issue 32: `not_video:`, `hidden: dotfile`,
`ratio_exceeded: header claims ...`, `corrupt: BadZipFile`, `<archive>` on the pages)."""

import pytest

from vidlora.reasons import in_words, member_name


@pytest.mark.parametrize("reason, words", [
    ("not_video: a .txt file is not a video or an archive of videos", "A .txt file is not a video or an archive of videos."),
    ("hidden: dotfile", "A hidden file (its name starts with a dot), left out."),
    ("ratio_exceeded: header claims 4096 MB from 1 MB",
     "Unpacks to far more than its packed size (a possible zip bomb), not unpacked."),
    ("corrupt: BadZipFile: File is not a zip file", "Damaged, or not what its name says (File is not a zip file)."),
    ("duplicate: content already stored; renamed: another member of the archive is also named a.mp4",
     "The same video as one already received (analysed once). Another file had the same name, so this one was renamed."),
    ("decoder gave up", "decoder gave up"),  # no code: as it is
    (None, ""),
])
def test_reasons_read_as_sentences(reason, words):
    assert in_words(reason) == words


def test_the_whole_archive_is_named_for_people():
    assert member_name("<archive>") == "the archive as a whole" and member_name("a.mp4") == "a.mp4"

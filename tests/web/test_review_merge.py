"""web.review.merge: what a second reviewer changed is applied over the first one's change."""

from web.review.merge import Removed, merge3

BASE = {"sealed": True, "finds": [{"material": "iron", "period": "han"}, {"material": "jade", "period": "tang"}]}


def test_changes_to_different_fields_both_survive_even_in_one_item():
    theirs = {"sealed": True, "finds": [{"material": "bronze", "period": "han"}, BASE["finds"][1]]}
    mine = {"sealed": False, "finds": [{"material": "iron", "period": "zhou"}, BASE["finds"][1]]}
    merged, conflicts = merge3(BASE, theirs, mine)
    assert merged == {"sealed": False, "finds": [{"material": "bronze", "period": "zhou"}, BASE["finds"][1]]}
    assert conflicts == []


def test_one_field_changed_both_ways_keeps_mine_and_names_it():
    theirs = {**BASE, "finds": [{"material": "bronze", "period": "han"}, BASE["finds"][1]]}
    mine = {**BASE, "finds": [{"material": "gold", "period": "han"}, BASE["finds"][1]]}
    merged, conflicts = merge3(BASE, theirs, mine)
    assert merged["finds"][0]["material"] == "gold" and conflicts == ["finds[0].material"]


def test_an_untouched_draft_is_their_answer_and_removals_carry_over():
    theirs = {"sealed": True, "finds": BASE["finds"][:1]}
    assert merge3(BASE, theirs, BASE) == (theirs, [])
    mine = {"finds": BASE["finds"]}  # I removed "sealed"; they removed a find: both hold
    assert merge3(BASE, theirs, mine) == ({"finds": BASE["finds"][:1]}, [])


def test_lists_merge_by_item_so_a_removed_item_never_comes_back():
    chambers = [{"name": "chamber 1", "shape": "square"}, {"name": "chamber 2", "shape": "round"}]
    theirs = chambers[:1]  # they removed chamber 2
    mine = [{"name": "antechamber", "shape": "square"}, chambers[1]]  # I renamed chamber 1
    assert merge3(chambers, theirs, mine) == ([mine[0]], [])
    # I changed the one they removed: it stays removed, and the path says why.
    merged, conflicts = merge3(chambers, theirs, [chambers[0], {**chambers[1], "shape": "oval"}])
    assert merged == theirs and conflicts == ["[1]"] and isinstance(conflicts[0], Removed)
    # Items either side added are kept, each once, near where they were added.
    added = {"name": "side niche", "shape": "round"}
    assert merge3(chambers, [*chambers, added], [added, *chambers]) == ([*chambers, added], [])
    merged, _ = merge3(chambers, [chambers[1]], [chambers[0], {**chambers[1], "shape": "x"}, added])
    assert merged == [{**chambers[1], "shape": "x"}, added]

"""The feedback loop: reviewed answers measure each adapter version (``agreement``), the gold
set is held out to test the next one (``gold``), and the rest become its training set
(``training_set``)."""

"""web.auth.throttle on a clock of its own: the allowance, the doubling wait and its cap, the
two counts and what clears them (the same code runs on Redis in the web tests)."""

import pytest

from web.auth.throttle import FREE_PER_ACCOUNT, FREE_PER_ADDRESS, MAX_WAIT_S, WINDOW_S, LocalCounters, SignInThrottled, Throttle


class Clock:
    def __init__(self):
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture()
def clock():
    return Clock()


@pytest.fixture()
def throttle(clock):
    return Throttle(LocalCounters(clock), clock)


def _wait(throttle, name, address) -> int:
    with pytest.raises(SignInThrottled) as refused:
        throttle.check(name, address)
    return refused.value.retry_after_s


def test_the_wait_doubles_past_the_allowance_up_to_the_cap(throttle, clock):
    for _ in range(FREE_PER_ACCOUNT - 1):
        throttle.failed("ana", "a")
    throttle.check("ana", "a")  # still free
    waits = []
    for _ in range(14):
        throttle.failed("ana", "a")
        waits.append(_wait(throttle, "ana", "a"))
        clock.now += waits[-1]
    assert waits[:5] == [1, 2, 4, 8, 16] and waits[-1] == MAX_WAIT_S


def test_the_counts_are_per_account_and_address_and_per_address(throttle):
    for _ in range(FREE_PER_ACCOUNT):
        throttle.failed("ana", "a")
    throttle.check("ana", "b")  # the owner elsewhere
    throttle.check("bo", "a")  # another account from the guesser's address
    for i in range(FREE_PER_ADDRESS - FREE_PER_ACCOUNT):
        throttle.failed(f"name-{i}", "a")
    assert _wait(throttle, "anyone", "a") >= 1
    throttle.check("anyone", "b")


def test_success_and_a_new_password_clear_the_account_and_time_forgets(throttle, clock):
    for _ in range(FREE_PER_ACCOUNT - 1):
        throttle.failed("ana", "a")
    throttle.succeeded("ana", "a")
    throttle.failed("ana", "a")
    throttle.check("ana", "a")  # the count started again
    for _ in range(FREE_PER_ACCOUNT):
        throttle.failed("ana", "a")
    throttle.forget_account("ANA ")  # names are matched as the sign-in form matches them
    throttle.check("ana", "a")
    for _ in range(FREE_PER_ACCOUNT):
        throttle.failed("cy", "c")
    clock.now += WINDOW_S + MAX_WAIT_S
    throttle.check("cy", "c")

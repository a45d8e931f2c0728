"""The storage's faults: passwords never printed, and nothing else masked."""

import pytest

from scalertune._storage._redact import redact

#: (password as the user means it, as written in the URL)
PASSWORDS = [
    ("my secret pw", "my secret pw"),
    ("my secret pw", "my%20secret%20pw"),
    ("p@ss:w/rd", "p%40ss%3Aw%2Frd"),
    ("s3cr3t-PW", "s3cr3t-PW"),
    ("e", "e"),
    ("127", "127"),
    ("failed", "failed"),
    ("ünïcødé pässwörd", "ünïcødé pässwörd"),
    ("'quoted\"", "'quoted\""),
]


@pytest.mark.parametrize("password, written", PASSWORDS, ids=[w for _, w in PASSWORDS])
def test_a_storage_url_is_printed_with_its_password_hidden_whatever_it_holds(password,
                                                                              written):
    url = f"postgresql://sp:{written}@127.0.0.1:5432/optuna"
    shown = redact(url)
    assert shown == "postgresql://sp:***@127.0.0.1:5432/optuna"
    # a message quoting the URL, as SQLAlchemy renders it or as the user wrote it
    from sqlalchemy.engine import make_url

    rendered = make_url(url).render_as_string(hide_password=False)
    for quoted in (url, rendered):
        assert redact(f"could not parse '{quoted}' here", url) == (
            f"could not parse '{shown}' here")


@pytest.mark.parametrize("message, password", [
    ("connection to server at \"127.0.0.1\", port 1 failed: Connection refused", "127"),
    ("FATAL:  password authentication failed for user \"sp\"", "failed"),
    ("FATAL:  password authentication failed for user \"sp\"", "password"),
    ("FATAL:  database \"optuna\" does not exist", "optuna"),
    ("server closed the connection unexpectedly", "e"),
])
def test_a_password_that_is_a_word_or_number_masks_nothing_else(message, password):
    assert redact(message, f"postgresql://sp:{password}@127.0.0.1:1/optuna") == message


@pytest.mark.parametrize("message", [
    "invalid connection option: host=db password=PW dbname=optuna",
    "invalid connection option: host=db password='PW' dbname=optuna",
    "postgresql://sp:PW@db/optuna is down",
])
@pytest.mark.parametrize("password", ["127", "failed", "my secret pw", "e"])
def test_a_password_given_as_one_in_a_message_is_hidden_however_short(message, password):
    shown = redact(message.replace("PW", password), f"postgresql://sp:{password}@db/optuna")
    assert shown == message.replace("PW", "***")


def test_a_distinctive_password_is_hidden_wherever_a_message_quotes_it():
    url = "postgresql://sp:my secret pw@db/optuna"
    assert redact("pw 'my secret pw' rejected", url) == "pw '***' rejected"
    assert redact("rejected s3cr3t-PW!", "postgresql://sp:s3cr3t-PW@db/x") == "rejected ***!"

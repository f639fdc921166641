import pytest

from vramscope.errors import VramscopeError
from vramscope.units import format_bytes, parse_percent, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("24GiB", 24 * 1024**3),
        ("24 GB", 24 * 1000**3),
        ("24g", 24 * 1024**3),
        ("512MiB", 512 * 1024**2),
        ("1.5GiB", int(1.5 * 1024**3)),
        ("1024", 1024),
        (2048, 2048),
    ],
)
def test_parse_size_reads_what_people_write(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["garbage", "24 parsecs", "", "-3GiB", "GiB"])
def test_parse_size_rejects_nonsense_with_one_line(text):
    with pytest.raises(VramscopeError) as info:
        parse_size(text)
    assert "\n" not in str(info.value)


def test_format_bytes_uses_binary_units():
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(3 * 1024**3) == "3.00 GiB"
    assert format_bytes(-2 * 1024**2) == "-2.00 MiB"
    assert format_bytes(None) == "n/a"


def test_parse_percent():
    assert parse_percent("5%") == pytest.approx(0.05)
    assert parse_percent(0.1) == pytest.approx(0.1)
    with pytest.raises(VramscopeError):
        parse_percent("lots")


@pytest.mark.parametrize(
    ("fraction", "text"), [(0.05, "5%"), (0.015, "1.5%"), (0.5, "50%"), (0.0, "0%")]
)
def test_a_margin_is_said_as_it_was_given(fraction, text):
    from vramscope.units import format_percent

    assert format_percent(fraction) == text

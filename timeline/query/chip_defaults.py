"""``timeline chip``'s defaults, in a module of their own so that the command's parser
(built for every command) shows them without importing the chip analysis."""

ACROSS = 16  # launches read for the run-wide slow units, by default (evenly spread in key order)

__all__ = ["ACROSS"]

"""The APIs the origin serves: the one governed pipeline every API goes through, and what each
API contributes to it (an Operation and its parser, token bounds and stream replay)."""

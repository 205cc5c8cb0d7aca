"""The bottom layer every app may import: the error base class, environment, JSON limits and the
API's parsers and pagination. It imports no app and nothing from config (config only wires)."""

"""The console's headless core. Nothing under this package imports Textual."""

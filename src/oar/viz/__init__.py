"""Making OAR's decisions visible: token-credit pages (HTML, terminal) and run reports (plots, Markdown)."""

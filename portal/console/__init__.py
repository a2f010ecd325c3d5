"""The console: server-rendered pages (htmx for partial updates), one module per area — work.py (instances
and batch jobs), monitor.py (an instance's page, its monitor, terminal and logs pages; the cluster), arrays,
images, files, teams, billing, account — with their forms, context processors, shortcuts and urls.py."""

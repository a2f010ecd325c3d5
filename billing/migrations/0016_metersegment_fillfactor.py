"""Half of each page of the meter segments table free (fillfactor 50; 0011 left 30 %).

A settlement run advances ``settled_until`` on every segment it settles: each of those updates stays on its
page (HOT, no new index entries) only where the page has room for the row's new version. At 70 % most pages
could take a few of their rows' new versions and no more: 38 % of bench/billing_settle.py's 100,000 updates
stayed on their page; at 50 %, 95 %, and the run took 4.87-5.22x the plain COPY against 5.21-5.31x,
interleaved in one session (5 Dec 2026). The table takes 40 % more pages; the postings, 1.5 a segment and
wider, stay the larger table. Pages written from now on keep the room (``VACUUM FULL`` gives it to the others).
"""

from django.db import migrations

from core.migration_ops import fillfactor


class Migration(migrations.Migration):
    dependencies = [("billing", "0015_team_invitations")]

    operations = [fillfactor("billing_metersegment", 50, previous=70)]

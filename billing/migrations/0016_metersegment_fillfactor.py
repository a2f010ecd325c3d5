"""Half of each page of the meter segments table free (fillfactor 50; 0011 left 30 %).

A settlement run advances ``settled_until`` on every segment it settles: each of those updates stays on its
page (HOT, no new index entries) only where the page has room for the row's new version. At 70 % most pages
could take a few of their rows' new versions and no more: 38 % of bench/billing_settle.py's 100,000 updates
stayed on their page; at 50 %, 95 %. Five interleaved pairs of runs (6 Dec 2026): 3.02-3.36 s against
3.27-3.42 s, faster in all five; 4.87-5.53x the plain COPY against 5.21-5.56x, lower in four: a few per cent,
no more (the run's time is mostly rating and the COPY). The table takes 40 % more pages; the postings, 1.5 a
segment and wider, stay the larger table, and fewer index entries a run means less for VACUUM. Pages written
from now on keep the room (``VACUUM FULL`` gives it to the others).
"""

from django.db import migrations

from core.migration_ops import fillfactor


class Migration(migrations.Migration):
    dependencies = [("billing", "0015_team_invitations")]

    operations = [fillfactor("billing_metersegment", 50, previous=70)]

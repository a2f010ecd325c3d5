"""Console URLs."""

from django.urls import path

from portal.console import account, arrays, billing, files, images, monitor, teams, work

urlpatterns = [
    path("", work.instance_list, name="console-instances"),
    path("instances/new/", work.instance_create, name="console-instance-create"),
    path("instances/<int:instance_id>/", monitor.instance_detail, name="console-instance"),
    path("instances/<int:instance_id>/monitor/", monitor.instance_monitor, name="console-instance-monitor"),
    path("instances/<int:instance_id>/terminal/", monitor.instance_terminal, name="console-instance-terminal"),
    path("instances/<int:instance_id>/clone/", account.instance_clone, name="console-instance-clone"),
    path("instances/<int:instance_id>/files/", files.instance_files, name="console-instance-files"),
    path("instances/<int:instance_id>/logs/", monitor.instance_logs, name="console-instance-logs"),
    path(
        "instances/<int:instance_id>/files/download/",
        files.instance_file_download,
        name="console-instance-file-download",
    ),
    path("instances/<int:instance_id>/files/upload/", files.instance_file_upload, name="console-instance-file-upload"),
    path("instances/<int:instance_id>/save-image/", images.instance_save_image, name="console-instance-save-image"),
    path("instances/<int:instance_id>/disk/", work.instance_disk, name="console-instance-disk"),
    path("images/", images.image_page, name="console-images"),
    path("images/<int:image_id>/delete/", images.image_delete, name="console-image-delete"),
    path("teams/", teams.team_list, name="console-teams"),
    path("teams/invitations/<int:invitation_id>/<str:answer>/", teams.team_invitation, name="console-team-invitation"),
    path("teams/<slug:slug>/", teams.team_detail, name="console-team"),
    path("teams/<slug:slug>/members/<str:action>/", teams.team_member, name="console-team-member"),
    path("account/", account.account_page, name="console-account"),
    path("account/token/<str:action>/", account.account_token, name="console-account-token"),
    path("account/password/", account.PasswordChangeView.as_view(), name="console-password"),
    path("instances/<int:instance_id>/<str:action>/", work.instance_action, name="console-instance-action"),
    path("cluster/", monitor.cluster_monitor, name="console-cluster"),
    path("billing/", billing.billing_page, name="console-billing"),
    path("billing/statement.csv", billing.statement_csv, name="console-billing-statement-csv"),
    path("billing/reports/", billing.billing_reports, name="console-billing-reports"),
    path("jobs/", work.job_list, name="console-jobs"),
    path("jobs/new/", work.job_create, name="console-job-create"),
    path("jobs/<int:job_id>/", work.job_detail, name="console-job"),
    path("jobs/<int:job_id>/<str:action>/", work.job_action, name="console-job-action"),
    path("arrays/<int:array_id>/", arrays.array_detail, name="console-array"),
    path("arrays/<int:array_id>/<str:action>/", arrays.array_action, name="console-array-action"),
]

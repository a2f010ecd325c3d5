"""Console URLs."""

from django.urls import path

from portal import account_views, array_views, billing_views, file_views, image_views, monitor_views, team_views, views

urlpatterns = [
    path("", views.instance_list, name="console-instances"),
    path("instances/new/", views.instance_create, name="console-instance-create"),
    path("instances/<int:instance_id>/", monitor_views.instance_detail, name="console-instance"),
    path("instances/<int:instance_id>/monitor/", monitor_views.instance_monitor, name="console-instance-monitor"),
    path("instances/<int:instance_id>/terminal/", monitor_views.instance_terminal, name="console-instance-terminal"),
    path("instances/<int:instance_id>/clone/", account_views.instance_clone, name="console-instance-clone"),
    path("instances/<int:instance_id>/files/", file_views.instance_files, name="console-instance-files"),
    path("instances/<int:instance_id>/logs/", monitor_views.instance_logs, name="console-instance-logs"),
    path(
        "instances/<int:instance_id>/files/download/",
        file_views.instance_file_download,
        name="console-instance-file-download",
    ),
    path(
        "instances/<int:instance_id>/files/upload/",
        file_views.instance_file_upload,
        name="console-instance-file-upload",
    ),
    path(
        "instances/<int:instance_id>/save-image/", image_views.instance_save_image, name="console-instance-save-image"
    ),
    path("instances/<int:instance_id>/disk/", views.instance_disk, name="console-instance-disk"),
    path("images/", image_views.image_page, name="console-images"),
    path("images/<int:image_id>/delete/", image_views.image_delete, name="console-image-delete"),
    path("teams/", team_views.team_list, name="console-teams"),
    path("teams/<slug:slug>/", team_views.team_detail, name="console-team"),
    path("teams/<slug:slug>/members/<str:action>/", team_views.team_member, name="console-team-member"),
    path("account/", account_views.account_page, name="console-account"),
    path("account/token/<str:action>/", account_views.account_token, name="console-account-token"),
    path("account/password/", account_views.PasswordChangeView.as_view(), name="console-password"),
    path("instances/<int:instance_id>/<str:action>/", views.instance_action, name="console-instance-action"),
    path("cluster/", monitor_views.cluster_monitor, name="console-cluster"),
    path("billing/", billing_views.billing_page, name="console-billing"),
    path("billing/statement.csv", billing_views.statement_csv, name="console-billing-statement-csv"),
    path("billing/reports/", billing_views.billing_reports, name="console-billing-reports"),
    path("jobs/", views.job_list, name="console-jobs"),
    path("jobs/new/", views.job_create, name="console-job-create"),
    path("jobs/<int:job_id>/", views.job_detail, name="console-job"),
    path("jobs/<int:job_id>/<str:action>/", views.job_action, name="console-job-action"),
    path("arrays/<int:array_id>/", array_views.array_detail, name="console-array"),
    path("arrays/<int:array_id>/<str:action>/", array_views.array_action, name="console-array-action"),
]

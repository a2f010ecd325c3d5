"""URLs of the REST API (mounted at /api/v1/)."""

from django.urls import path

from portal.api import arrays, auth, billing, files, logs, views
from portal.services.work import ACTIONS, JOB_ACTIONS

urlpatterns = [
    path("me/", views.MeApi.as_view(), name="api-me"),
    path("auth/token/", auth.TokenApi.as_view(), name="api-auth-token"),
    path("gpu-types/", views.GpuTypeListApi.as_view(), name="api-gpu-types"),
    path("gpu-types/recommend/", views.GpuTypeRecommendApi.as_view(), name="api-gpu-types-recommend"),
    path("images/", views.ImageListApi.as_view(), name="api-images"),
    path("images/<int:image_id>/", views.ImageDetailApi.as_view(), name="api-image"),
    path("instances/<int:instance_id>/disk/", views.InstanceDiskApi.as_view(), name="api-instance-disk"),
    path(
        "instances/<int:instance_id>/save-image/", views.InstanceSaveImageApi.as_view(), name="api-instance-save-image"
    ),
    path("instances/", views.InstanceListApi.as_view(), name="api-instances"),
    path("instances/<int:instance_id>/", views.InstanceDetailApi.as_view(), name="api-instance"),
    path("instances/<int:instance_id>/clone/", views.InstanceCloneApi.as_view(), name="api-instance-clone"),
    path("nodes/", views.NodeListApi.as_view(), name="api-nodes"),
    path("jobs/", views.JobListApi.as_view(), name="api-jobs"),
    path("jobs/<int:job_id>/", views.JobDetailApi.as_view(), name="api-job"),
    path("jobs/<int:job_id>/logs/", logs.LogsApi.as_view(kind="jobs"), name="api-job-logs"),
    path("instances/<int:instance_id>/logs/", logs.LogsApi.as_view(kind="instances"), name="api-instance-logs"),
    path("arrays/", arrays.ArrayListApi.as_view(), name="api-arrays"),
    path("arrays/<int:array_id>/", arrays.ArrayDetailApi.as_view(), name="api-array"),
    path("billing/", billing.BillingApi.as_view(), name="api-billing"),
    path("billing/statement/", billing.StatementApi.as_view(), name="api-billing-statement"),
    path("billing/topups/", billing.TopUpApi.as_view(), name="api-billing-topups"),
    path(
        "billing/topups/requests/<int:request_id>/approve/",
        billing.TopUpApproveApi.as_view(),
        name="api-billing-topup-approve",
    ),
    path("prices/", billing.PriceApi.as_view(), name="api-prices"),
] + [
    path(
        f"instances/<int:instance_id>/{action}/",
        views.InstanceActionApi.as_view(action_name=action),
        name=f"api-instance-{action}",
    )
    for action in ACTIONS
]
# Files of a running instance or job (the owner's): list, download, upload.
for kind, plural in (("instance", "instances"), ("job", "jobs")):
    urlpatterns += [
        path(f"{plural}/<int:{kind}_id>/files/", files.FileListApi.as_view(kind=kind), name=f"api-{kind}-files"),
        path(
            f"{plural}/<int:{kind}_id>/files/download/",
            files.FileDownloadApi.as_view(kind=kind),
            name=f"api-{kind}-file-download",
        ),
        path(
            f"{plural}/<int:{kind}_id>/files/upload/",
            files.FileUploadApi.as_view(kind=kind),
            name=f"api-{kind}-file-upload",
        ),
    ]
urlpatterns += [
    path(f"jobs/<int:job_id>/{action}/", views.JobActionApi.as_view(action_name=action), name=f"api-job-{action}")
    for action in JOB_ACTIONS
]
urlpatterns += [
    path(
        f"arrays/<int:array_id>/{action}/",
        arrays.ArrayActionApi.as_view(action_name=action),
        name=f"api-array-{action}",
    )
    for action in arrays.ARRAY_ACTIONS
]

"""Console URLs."""

from django.urls import path

from portal import views

urlpatterns = [
    path("", views.instance_list, name="console-instances"),
    path("instances/new/", views.instance_create, name="console-instance-create"),
    path("instances/<int:instance_id>/<str:action>/", views.instance_action, name="console-instance-action"),
]

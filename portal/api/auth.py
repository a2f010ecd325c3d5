"""POST /auth/token/ {"username", "password"}: the user's API token, for ``gpucloud login`` without the console.

It answers the token the account page shows (made on first use); it never replaces
one, so other scripts holding it keep working (replace or revoke it on the account
page). Throttled per client address and username as the console's sign-in form is.
"""

from django.contrib.auth import authenticate
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.authtoken.models import Token
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.api.throttles import LoginRateThrottle
from scheduler.errors import InvalidInput


class TokenLoginThrottle(LoginRateThrottle):
    def get_cache_key(self, request, view):
        username = str(request.data.get("username") or "").lower()[:150]
        return self.cache_format % {"scope": self.scope, "ident": f"{self.get_ident(request)}:{username}"}


class TokenApi(APIView):
    authentication_classes = []  # credentials are in the body; no session (and so no CSRF) involved
    permission_classes = [AllowAny]
    throttle_classes = [TokenLoginThrottle]

    class CredentialsInput(serializers.Serializer):
        username = serializers.CharField(max_length=150)
        password = serializers.CharField(max_length=4096, style={"input_type": "password"})

    class TokenOutput(serializers.Serializer):
        token = serializers.CharField(help_text="Send it as `Authorization: Token <token>`.")
        username = serializers.CharField()

    @extend_schema(request=CredentialsInput, responses=TokenOutput, auth=[])
    def post(self, request):
        data = self.CredentialsInput(data=request.data)
        data.is_valid(raise_exception=True)
        user = authenticate(request, **data.validated_data)
        if user is None:
            raise InvalidInput("wrong username or password", field="password")
        token, _ = Token.objects.get_or_create(user=user)
        return Response(self.TokenOutput({"token": token.key, "username": user.username}).data)

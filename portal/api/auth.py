"""POST /auth/token/ {"username", "password", "name"?}: a new API token, for ``gpucloud login`` without the console.

Each call makes a new token (only its digest is stored, so an earlier one cannot be
shown again); the others keep working until they expire, are revoked on the account
page, or the password changes. Throttled per client address and username as the
console's sign-in form is.
"""

from django.contrib.auth import authenticate
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from core.errors import InvalidInput
from portal.services import tokens
from portal.throttles import LoginRateThrottle


class TokenLoginThrottle(LoginRateThrottle):
    def get_cache_key(self, request, view):
        body = request.data if isinstance(request.data, dict) else {}  # a JSON list or string is refused later
        return self.key_for(request, body.get("username"))


class TokenApi(APIView):
    authentication_classes = []  # credentials are in the body; no session (and so no CSRF) involved
    permission_classes = [AllowAny]
    throttle_classes = [TokenLoginThrottle]

    class CredentialsInput(serializers.Serializer):
        username = serializers.CharField(max_length=150)
        password = serializers.CharField(max_length=4096, style={"input_type": "password"})
        name = serializers.CharField(max_length=64, default="gpucloud login", help_text="Where the token is used.")

    class TokenOutput(serializers.Serializer):
        token = serializers.CharField(help_text="Send it as `Authorization: Token <token>`.")
        username = serializers.CharField()
        name = serializers.CharField()
        expires_at = serializers.DateTimeField()

    @extend_schema(request=CredentialsInput, responses=TokenOutput, auth=[])
    def post(self, request):
        data = self.CredentialsInput(data=request.data)
        data.is_valid(raise_exception=True)
        d = data.validated_data
        user = authenticate(request, username=d["username"], password=d["password"])
        if user is None:
            raise InvalidInput("wrong username or password", field="password")
        token, key = tokens.token_create(user=user, name=d["name"])
        body = {"token": key, "username": user.username, "name": token.name, "expires_at": token.expires_at}
        return Response(self.TokenOutput(body).data)

"""REST API for the image catalog: the images a user may run, pinned by digest."""

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import generics, serializers

from images.access import image_list_usable_by_tenants
from images.models import Image
from tenants.access import tenant_list_submittable


class ImageSerializer(serializers.ModelSerializer):
    reference = serializers.CharField(read_only=True, help_text="repository@digest: what runs.")
    frameworks = serializers.DictField(child=serializers.CharField(), read_only=True)

    class Meta:
        model = Image
        fields = [
            "id",
            "reference",
            "repository",
            "tag",
            "digest",
            "description",
            "architecture",
            "cuda_version",
            "nccl_version",
            "frameworks",
            "size_bytes",
            "created",
        ]
        read_only_fields = fields


@extend_schema(tags=["images"])
class ImageListApi(generics.GenericAPIView):
    serializer_class = ImageSerializer

    @extend_schema(
        responses={
            200: ImageSerializer(many=True),
            401: OpenApiResponse(description="No credentials, or an invalid token."),
            404: OpenApiResponse(description="No such page."),
        }
    )
    def get(self, request):
        """Approved images you may run: visible to all, or allow-listed for one of your
        tenants."""
        images = image_list_usable_by_tenants(
            tenants=tenant_list_submittable(user=request.user)
        ).order_by("repository", "tag", "id")
        page = self.paginate_queryset(images)
        return self.get_paginated_response(ImageSerializer(page, many=True).data)

"""Browser forms; they parse input and hand it to services."""

from __future__ import annotations

from django import forms
from django.contrib.auth import get_user_model

from workspaces.models import Role

User = get_user_model()


class MemberGrantForm(forms.Form):
    username = forms.CharField(max_length=150)
    role = forms.ChoiceField(choices=Role.choices)

    def clean_username(self):
        username = self.cleaned_data["username"]
        user = User.objects.filter(username=username, is_active=True).first()
        if user is None:
            raise forms.ValidationError(f"No active user '{username}'.")
        return user


class MemberRoleForm(forms.Form):
    role = forms.ChoiceField(choices=Role.choices)


class TokenCreateForm(forms.Form):
    name = forms.CharField(max_length=100)
    workspaces = forms.MultipleChoiceField(
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="Leave empty to reach every workspace you are a member of.",
    )

    def __init__(self, *args, workspace_choices: list[tuple[str, str]], **kwargs):
        super().__init__(*args, **kwargs)
        # the field is a MultipleChoiceField; fields[...] is typed as any Field.
        self.fields["workspaces"].choices = workspace_choices  # type: ignore[attr-defined]

"""Small trained modules that sit on a target model's hidden states (Medusa heads)."""
